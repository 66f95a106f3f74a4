"""The fleet's operations, served by the ingress under ``/v1/fleet/`` (docs/fleet.md).

- ``GET /v1/fleet/replicas``: the engine replicas that registered (id, URL, KV events
  endpoints, PID, engine id), which are draining, how many requests each answered through this
  ingress, how many requests were retried on another replica (``retried``), and the sessions of
  lost replicas resumed on another one (``resumed``: session, from, to, step index, seconds).
- ``POST /v1/fleet/drain`` ``{"replica": id, "timeout_s"?}``: take the replica out of service
  and lose nothing: (1) the router stops sending it new requests (it is excluded from every
  route); (2) its migration allow-list is set to the other replicas' URLs; (3) each live session
  it holds is migrated to another replica with the two-phase hand-over (the session is
  served by the source until the target committed, never by both), the target chosen round-robin
  among the others, and the ingress then routes the session there (while a session moves, its new
  requests wait in the ingress; a step already running ends first: the migration, refused
  ``busy`` meanwhile, is retried); (4) the replica's requests in
  flight finish (it is polled until idle or ``timeout_s``). The answer lists every session moved
  or failed (a failed one is still served by the source, which stays excluded from new routes),
  and the seconds it took.
- ``POST /v1/fleet/update_weights`` ``{"source", "weights_version"}``: a rolling update, replica by
  replica (each is excluded from new routes, drains its requests in flight on the old weights:
  policy ``drain``, switches, and takes requests again; its sessions keep going to it); the router never counts a
  block of another version as a hit (the keys differ), so while versions are mixed each request
  is served entirely by one version. The answer lists the version of each replica, and
  ``GET /v1/fleet/replicas`` shows each replica's new ``weights_version`` as soon as it switched.
  Once every replica switched, the version is the fleet's: a prompt is routed only to replicas
  registered on it, and must be answered on it (``RouteRequest.require_version``: a replica of
  another version that is chosen anyway refuses with 409 ``weights_version_mismatch`` and the
  ingress tries another), and a replica that registers later on other weights (one Ray
  started in place of a lost one, built from the deployment's original arguments) is taken out of
  service, switched to the fleet's weights (:meth:`FleetOps.catch_up`), and put back.

Every operation first forgets the registered replicas whose actor is gone (:meth:`FleetOps.prune`:
a killed replica), so none addresses a dead one (an id Ray no longer has would route elsewhere).

The fleet's own secret (``EXECSTATE_KV_SECRET``, the same on every replica) signs the hand-overs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from execstate.fleet.ray_app.liveness import actor_alive
from execstate.fleet.ray_app.prompt_route import SessionReplicas
from execstate.fleet.ray_app.session_resume import SessionRouting
from execstate.fleet.router.policy import RouteRequest

logger = logging.getLogger("execstate.fleet")
BUSY_RETRY_S = 0.05  # a drain retries a session refused ``busy`` (a step in flight) this often


class Ingress(Protocol):
    """What the operations use of the ingress (``ingress.py``'s ``FleetIngress``)."""

    engines: DeploymentHandle
    owners: SessionReplicas
    replicas: dict[str, dict[str, Any]]
    draining: set[str]
    served: Counter[str]
    retried: int
    sessions: SessionRouting

    async def send(self, route: RouteRequest, method: str, path: str, query: str, headers: list[tuple[str, str]],
                   body: bytes) -> tuple[dict[str, Any], AsyncIterator[bytes]]: ...

    def handle_of(self, replica_id: str) -> DeploymentHandle: ...


@dataclass(frozen=True)
class WeightsTarget:
    """The weights the fleet runs: ``source`` and the ``requested`` version, set when a rolling
    update begins; ``running``, the version the replicas report once switched (the engine
    namespaces a supplied one: ``v1`` runs as ``user:v1``); ``complete`` once every replica then
    registered switched."""

    source: str
    requested: str
    running: str | None = None
    complete: bool = False


class FleetOps:
    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress
        self.target: WeightsTarget | None = None  # None: the weights each replica was built with
        self.catching_up: dict[str, asyncio.Task[None]] = {}  # replica id -> its switch to the target

    def pinned_version(self) -> str | None:
        """The weights version a prompt must be served by: the fleet's, once an update completed
        (None: any, e.g. while an update rolls and both versions serve)."""
        t = self.target
        return t.running if t is not None and t.complete else None

    def on_register(self, info: dict[str, Any]) -> None:
        """A replica registered: if the fleet was updated and it runs other weights, switch it
        (in the background: registration returns at once)."""
        rid, target = info["replica_id"], self.target
        if target is None or info.get("weights_version") == target.running or rid in self.catching_up:
            return
        self.catching_up[rid] = asyncio.get_running_loop().create_task(self.catch_up(rid, target))

    async def catch_up(self, replica_id: str, target: WeightsTarget, attempts: int = 20,
                       retry_s: float = 0.5) -> None:
        """Switch a replica that registered on other weights to ``target``: out of service while
        it switches (the router excludes it), back in afterwards. Retried while Ray does not route
        to it yet (a replica registers before Serve lists it: the call then reaches another
        replica, which refuses it by id); left out of service, and logged, if it never switches."""
        ing = self.ingress
        ing.draining.add(replica_id)
        try:
            for _ in range(attempts):
                try:
                    version = await ing.handle_of(replica_id).update_weights.remote(
                        RouteRequest(session_replica=replica_id), target.source, target.requested)
                except Exception as e:  # noqa: BLE001 - not routable yet, or gone: tried again
                    logger.info("replica %s did not switch to %s yet: %s", replica_id, target.requested, e)
                    await asyncio.sleep(retry_s)
                    continue
                self.switched(replica_id, version)
                ing.draining.discard(replica_id)
                return
            logger.error("replica %s could not switch to the fleet's weights %s: left out of service",
                         replica_id, target.requested)
        finally:
            self.catching_up.pop(replica_id, None)

    async def handle(self, request: Request, operator: bool) -> Response:
        """Answer one operation; ``operator``: the caller may change the fleet (drain, update), else
        those answer 403 before any work (the ingress decided who called: ``ingress.py``)."""
        path, method = request.url.path, request.method
        if method == "POST" and not operator:
            return JSONResponse({"error": {"message": f"{path} changes the fleet: it needs the key of an operator "
                                           "tenant (execstate serve --ray --fleet-operator TENANT)",
                                           "type": "invalid_request_error", "code": "unauthorized"}}, 403)
        try:
            body: Any = json.loads(await request.body() or b"{}") if method == "POST" else {}
        except ValueError:
            return _error(400, "the body is not JSON")
        if method in ("GET", "POST"):
            await self.prune()
        if (method, path) == ("GET", "/v1/fleet/replicas"):
            ing = self.ingress
            return JSONResponse({"replicas": [{**info, "draining": rid in ing.draining, "served": ing.served[rid]}
                                              for rid, info in sorted(ing.replicas.items())],
                                 "retried": ing.retried, "resumed": list(ing.sessions.resumed)})
        if (method, path) == ("POST", "/v1/fleet/drain"):
            rid = body.get("replica")
            if rid not in self.ingress.replicas:
                return _error(404, f"no replica {rid!r} registered")
            return JSONResponse(await self.drain(rid, float(body.get("timeout_s", 60.0))))
        if (method, path) == ("POST", "/v1/fleet/update_weights"):
            source, version = body.get("source"), body.get("weights_version")
            if not isinstance(source, str) or not isinstance(version, str) or not version:
                return _error(400, "source (a checkpoint directory) and weights_version are required")
            return JSONResponse(await self.update_weights(source, version))
        return _error(404, f"no fleet operation {method} {path}")

    async def prune(self) -> list[str]:
        """Forget registered replicas whose actor is gone (a killed replica: Ray no longer finds its
        actor by name, the replica's full id). The ids forgotten."""
        ing = self.ingress
        gone = [rid for rid in sorted(ing.replicas) if not await asyncio.to_thread(actor_alive, rid)]
        for rid in gone:
            ing.replicas.pop(rid, None)
            ing.draining.discard(rid)
        return gone

    async def drain(self, replica_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
        ing = self.ingress
        t0 = time.monotonic()
        ing.draining.add(replica_id)
        here = RouteRequest(session_replica=replica_id)
        role = ing.replicas[replica_id].get("role")
        others = [info for rid, info in sorted(ing.replicas.items()) if rid not in ing.draining
                  and info.get("role") == role]  # a PD fleet: decode replicas' sessions go to decode replicas
        moved: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        if others:
            await ing.handle_of(replica_id).set_migration_peers.remote(here, [o["url"] for o in others])
        for i, (caller, sid, auth) in enumerate(ing.owners.held_by(replica_id)):
            if not others:
                failed.append({"session_id": sid, "error": "no other replica to migrate to"})
                continue
            target = others[i % len(others)]
            headers = [("content-type", "application/json")] + ([("authorization", auth)] if auth else [])
            payload = json.dumps({"target": target["url"]}).encode()
            t1 = time.monotonic()
            async with ing.sessions.holding(caller, sid):  # the session's new requests wait for the move
                while True:
                    head, chunks = await ing.send(here, "POST", f"/v1/sessions/{sid}/migrate", "", headers, payload)
                    answer = b"".join([c async for c in chunks])
                    if head["status"] != 409 or b'"busy"' not in answer or time.monotonic() > t0 + timeout_s:
                        break
                    await asyncio.sleep(BUSY_RETRY_S)  # a step in flight: it ends, then the session moves
                if head["status"] == 200:
                    ing.owners.set(caller, sid, target["replica_id"], engine_id=target.get("engine_id"))
            if head["status"] == 200:
                moved.append({"session_id": sid, "target": target["replica_id"], "seconds": time.monotonic() - t1})
            else:
                failed.append({"session_id": sid, "status": head["status"], "error": answer.decode(errors="replace")})
        idle = await self._wait_idle(here, t0 + timeout_s)
        return {"replica": replica_id, "moved": moved, "failed": failed, "idle": idle,
                "seconds": time.monotonic() - t0}

    async def _wait_idle(self, here: RouteRequest, deadline: float) -> bool:
        while True:
            info = await self.ingress.handle_of(here.session_replica or "").describe.remote(here)
            if info["queue_len"] == 0:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)

    def rolling_order(self) -> list[str]:
        """The order a rolling update takes the replicas in."""
        return sorted(self.ingress.replicas)

    def switched(self, replica_id: str, version: str) -> None:
        """``replica_id`` runs ``version`` now: ``GET /v1/fleet/replicas`` shows it."""
        if replica_id in self.ingress.replicas:
            self.ingress.replicas[replica_id]["weights_version"] = version

    async def update_weights(self, source: str, version: str) -> dict[str, Any]:
        ing = self.ingress
        versions: dict[str, str] = {}
        self.target = target = WeightsTarget(source, version)  # a replica registering meanwhile catches up
        for rid in self.rolling_order():
            held = rid in ing.draining
            ing.draining.add(rid)  # new requests go to the others while this one drains and switches
            try:
                versions[rid] = await ing.handle_of(rid).update_weights.remote(RouteRequest(session_replica=rid),
                                                                               source, version)
                self.switched(rid, versions[rid])
                if target.running is None:
                    self.target = target = replace(target, running=versions[rid])
            finally:
                if not held:
                    ing.draining.discard(rid)
        running = set(versions.values())
        self.target = WeightsTarget(source, version, running.pop() if len(running) == 1 else None, complete=True)
        return {"versions": versions}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": None}}, status)
