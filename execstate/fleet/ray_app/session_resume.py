"""The ingress's session requests, and the resume of a lost replica's sessions (docs/fleet.md
"A replica lost").

:meth:`SessionRouting.send` forwards a ``/v1/sessions/{id}...`` request to the replica holding
the session (``SessionReplicas``). When that replica is **lost** — the forward failed before an
answer and Ray reports the replica's actor dead (or the error is Ray's ``ActorDiedError``), or
Ray already dropped it and another replica answered instead, or a fleet operation already forgot
it — the session is resumed on another replica from its copy in the shared tier
(``session/lm/shared_copy.py``: the replicas copy their live sessions every ``copy_every_s``;
a hibernated session's manifest is its copy), then the request is sent there:

1. one resume per session at a time (an ``asyncio.Lock`` per session, which a drain also holds
   while it moves the session: :meth:`SessionRouting.holding`): a request that waited finds the
   session already moved and follows it;
2. the target: a live, non-draining replica with a shared tier, the one holding the fewest
   sessions;
3. a signed reference (``hibernation_import.make_reference``, the fleet's secret) to the
   manifest key ``<lost replica's engine id>:<tenant>:<session id>``, bound to the target's
   engine id, a nonce, the tenant, 60 s; ``POST /v1/sessions/import {"reference"}`` on the target
   verifies it and **claims** the manifest (an atomic delete in Redis: of any number of replicas
   or ingresses trying, one wins; at most one replica serves the session);
4. the owner map then names the target: the session's next steps continue from its copy's step
   (the steps after the copy are lost, with the replica).

The request that found the replica lost is then sent to the target if nothing of it can have
been applied (the replica was known lost before it was sent, or another replica answered
instead) or if it only reads (``GET``); a request that was on the lost replica when it died may
have been applied, and even copied, before the death, so it is not sent again: it is answered
``503`` with ``type: session_resumed`` and the ``step_index`` the session resumed at
(:class:`SessionResumed`), and the client resends it if that step does not include it.

Ownership: the owner map is keyed by the caller's credential digest, the tenant in the
reference is the one recorded when the session was opened (the fleet's ``KeyRing``), and the
target creates the session under the manifest's tenant, checked equal to the reference's: a
request of another tenant never finds, resumes or gets the session.

A session that cannot be resumed is answered with ``type: session_lost``: ``404`` and forgotten
when it has no copy (never copied, closed, expired, claimed elsewhere); ``503`` and kept when
it may resume later (no live replica with a shared tier yet — Ray's replacement is starting — or
the shared tier unreachable): its next request tries again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from ray.exceptions import ActorDiedError
from ray.serve.handle import DeploymentHandle

from execstate.fleet.ray_app.liveness import actor_alive
from execstate.fleet.ray_app.prompt_route import Held, SessionReplicas
from execstate.fleet.router.policy import RouteRequest
from execstate.identity.secret_ring import SecretRing
from execstate.session.lm.hibernation_import import make_reference
from execstate.state.tiers.manifest_keys import manifest_key

logger = logging.getLogger("execstate.fleet")
REFERENCE_TTL_S = 60.0
MAX_LOG = 10_000  # resumes remembered
SAFE_METHODS = ("GET", "HEAD")  # sent again after a resume; any other request is answered SessionResumed
Headers = list[tuple[str, str]]


class Ingress(Protocol):
    """What the session routing uses of the ingress (``ingress.py``'s ``FleetIngress``)."""

    engines: DeploymentHandle
    owners: SessionReplicas
    replicas: dict[str, dict[str, Any]]
    draining: set[str]

    async def send(self, route: RouteRequest, method: str, path: str, query: str, headers: Headers,
                   body: bytes) -> tuple[dict[str, Any], AsyncIterator[bytes]]: ...


class SessionResumed(Exception):
    """The request was sent to the session's replica, which was lost before answering; the
    session is resumed elsewhere at ``step_index``, but the request is not sent again: it may have
    been applied (and copied) before the replica died, and a step applied twice is not the same
    session. The client checks ``step_index`` and resends what is missing."""

    def __init__(self, session_id: str, step_index: int | None) -> None:
        self.step_index = step_index
        super().__init__(f"the replica holding session {session_id!r} was lost while this request was on it; the "
                         f"session was resumed on another replica at step {step_index} from its copy in the shared "
                         "tier: send the request again if that step does not include it")


class SessionLost(Exception):
    """The session's replica is lost and the session could not be resumed elsewhere: for good
    (``retry`` False: no copy of it; the ingress forgets it, 404) or for now (``retry``: no replica
    to resume it on, the shared tier unreachable; 503, the next request tries again)."""

    def __init__(self, session_id: str, why: str, retry: bool = False) -> None:
        self.retry = retry
        later = "; try again later" if retry else ""
        super().__init__(f"the replica holding session {session_id!r} was lost and the session could not be "
                         f"resumed from the shared tier: {why}{later}")


@dataclass
class _Hold:
    lock: asyncio.Lock
    users: int = 0  # holders inside or waiting


class SessionRouting:
    def __init__(self, ingress: Ingress, secret: SecretRing | None) -> None:
        self.ingress = ingress
        self.secret = secret
        self._locks: dict[tuple[str, str], _Hold] = {}
        self.resumed: deque[dict[str, Any]] = deque(maxlen=MAX_LOG)  # each resume (GET /v1/fleet/replicas, bench)
        self._steps: OrderedDict[tuple[str, str], int | None] = OrderedDict()  # the step each resumed at

    async def send(self, caller: str, session_id: str, method: str, path: str, query: str, headers: Headers,
                   body: bytes) -> tuple[dict[str, Any], AsyncIterator[bytes]]:
        """Forward a session's request to its replica, resuming the session first if the replica
        is lost (module docstring); ``SessionLost`` when it cannot be resumed."""
        ing = self.ingress
        hold = self._locks.get((caller, session_id))
        if hold is not None and hold.lock.locked():  # moving (a drain) or being resumed: wait, then follow it
            async with hold.lock:
                pass
        held = ing.owners.held(caller, session_id)
        if held is None:  # not opened here: any replica answers (not_found, or a path that needs none)
            return await ing.send(RouteRequest(), method, path, query, headers, body)
        if held.replica_id not in ing.replicas and await self._lost(held.replica_id, None):
            held = await self.resume(caller, session_id, held)
        try:
            head, chunks = await ing.send(RouteRequest(session_replica=held.replica_id), method, path, query,
                                          headers, body)
        except RuntimeError as e:  # failed before answering
            if not await self._lost(held.replica_id, e.__cause__):
                raise
            held = await self.resume(caller, session_id, held)
            if method not in SAFE_METHODS:  # it may have been applied (and even copied) before the replica died
                raise SessionResumed(session_id, self.step_of(caller, session_id)) from None
        else:
            if head["replica"] == held.replica_id or not await self._lost(held.replica_id, None):
                return head, chunks
            await _discard(chunks)  # Ray had dropped the lost replica: another one answered (not_found) instead
            held = await self.resume(caller, session_id, held)
        return await ing.send(RouteRequest(session_replica=held.replica_id), method, path, query, headers, body)

    def step_of(self, caller: str, session_id: str) -> int | None:
        """The step index the session was last resumed at."""
        return self._steps.get((caller, session_id))

    @contextlib.asynccontextmanager
    async def holding(self, caller: str, session_id: str) -> AsyncIterator[None]:
        """Hold the session's requests in the ingress while the caller moves it (a drain, a
        resume); one holder at a time (the lock is forgotten once no holder waits for it)."""
        key = (caller, session_id)
        hold = self._locks.get(key)
        if hold is None:
            hold = self._locks[key] = _Hold(asyncio.Lock())
        hold.users += 1
        try:
            async with hold.lock:
                yield
        finally:
            hold.users -= 1
            if hold.users == 0:
                self._locks.pop(key, None)

    async def resume(self, caller: str, session_id: str, lost: Held) -> Held:
        """Resume the session held by the lost ``lost.replica_id`` on another replica (module
        docstring); where it is now."""
        ing = self.ingress
        async with self.holding(caller, session_id):
            held = ing.owners.held(caller, session_id)
            if held is None:
                raise SessionLost(session_id, "it was forgotten meanwhile")
            if held.replica_id != lost.replica_id:
                return held  # a request that held the lock before resumed it
            try:
                return await self._resume(caller, session_id, held)
            except SessionLost as e:
                if not e.retry:
                    ing.owners.drop(caller, session_id)
                raise

    async def _resume(self, caller: str, session_id: str, held: Held) -> Held:
        ing = self.ingress
        if self.secret is None or held.engine_id is None or held.tenant is None:
            raise SessionLost(session_id, "the fleet has no shared secret, or the session's engine or tenant is "
                              "unknown")
        ing.replicas.pop(held.replica_id, None)  # Ray reported it dead (``send``)
        ing.draining.discard(held.replica_id)
        load = {rid: len(ing.owners.held_by(rid)) for rid in ing.replicas}
        targets = sorted((rid for rid, info in ing.replicas.items() if rid not in ing.draining
                          and info.get("shared_copies") and info.get("engine_id")), key=lambda r: (load[r], r))
        key = manifest_key(held.engine_id, held.tenant, session_id)
        why, retry = "no live replica with a shared tier to resume it on", True
        t0 = time.monotonic()
        for rid in targets[:2]:
            target = ing.replicas[rid]
            ref = make_reference(self.secret, key, session_id, held.tenant, target["engine_id"], REFERENCE_TTL_S)
            payload = json.dumps({"reference": base64.b64encode(ref).decode()}).encode()
            try:
                head, chunks = await ing.send(RouteRequest(session_replica=rid), "POST", "/v1/sessions/import", "",
                                              [("content-type", "application/json")], payload)
            except RuntimeError as e:
                why, retry = f"replica {rid} failed: {e}", True
                continue
            answer = b"".join([c async for c in chunks])
            if head["status"] == 200 and head["replica"] == rid:
                info = json.loads(answer)
                ing.owners.set(caller, session_id, rid, engine_id=target["engine_id"])
                self._steps[(caller, session_id)] = info.get("step_index")
                while len(self._steps) > MAX_LOG:
                    self._steps.popitem(last=False)
                self.resumed.append({"session_id": session_id, "from": held.replica_id, "to": rid,
                                     "step_index": info.get("step_index"), "seconds": time.monotonic() - t0,
                                     "at": time.time()})
                logger.info("session %s of lost replica %s resumed on %s at step %s", session_id,
                            held.replica_id, rid, info.get("step_index"))
                return ing.owners.held(caller, session_id) or Held(rid)
            why = f"replica {rid} answered {head['status']}: {answer.decode(errors='replace')[:300]}"
            retry = head["status"] >= 500  # the shared tier unreachable: the copy may still be there
            if head["status"] in (404, 409):
                break  # no copy (never copied, closed, expired) or claimed by another: no other target helps
        raise SessionLost(session_id, why, retry)

    async def _lost(self, replica_id: str, error: BaseException | None) -> bool:
        """Whether ``replica_id`` is gone: Ray said its actor died, or no longer finds it."""
        if isinstance(error, ActorDiedError):
            return True
        return not await asyncio.to_thread(actor_alive, replica_id)


async def _discard(chunks: AsyncIterator[bytes]) -> None:
    async for _ in chunks:
        pass
