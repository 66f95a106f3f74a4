"""Session migration between two servers, the sending side (protocol:
``session/lm/migration_*.py``; the receiving side: ``handover.py``).

``POST /v1/sessions/{id}/migrate`` ``{"target": URL or engine id, "timeout_s"?: float}``:

1. ``target`` must be in this server's ``--migration-targets`` (``targets.py``;
   ``target_not_allowed`` otherwise, before anything happens); the session must be the caller's
   (another tenant's, or an id that never existed, is ``not_found``), open and not held by a live
   connection (``session_in_use``): checked before any outbound call, so a caller who does not own
   the session learns nothing from, and causes no traffic to, the target.
2. On the engine thread the session is frozen (MIGRATING), its full KV blocks are exported (PD
   exporter) and its offer is built: bound to the target's engine id (listed, or asked with a
   signed ``identify``), a fresh nonce, its tenant and an expiry ``timeout_s`` away, signed with
   the shared secret. No API key is ever sent to the target: the instances authenticate each
   other with the shared secret (``handover_wire.py``), never with a client's credential.
3. The offer goes to the target's ``/v1/sessions/import``; the target imports the session without
   serving it and acknowledges with a signed answer.
4. On a verified acknowledgement the source closes its copy, then commits (``/commit``, retried
   until the offer's expiry). 200: ``{"status": "migrated", "committed": true, "target",
   "target_engine_id", "session_id", "num_tokens", "blocks_transferred", ...}``.
5. Without one (refused, lost, unreachable, a crash at any step) the source asks the target to
   abort (``/abort``). It serves the session again only once the abort is confirmed, or, if the
   target cannot confirm, once the offer's expiry plus the skew margin has passed (the target
   drops an uncommitted import at its expiry); meanwhile calls on it get ``busy``. An offer that
   was never sent (the target refused the connection) is resumed at once. The error answered says
   which.

**Invariant: at most one server serves a session at any time.** The source's half: it stops
serving when it freezes the session; it closes its copy before it sends the commit (so the target
serves only what the source gave up); it serves again only when the target can no longer serve
it (a confirmed abort, an offer never delivered, or the offer expired past the skew margin),
because the target serves an import only on a signed commit for that nonce, which the source
never sends once it resumed. The two-server tests inject a failure at every step
(``tests/security/``).

The migration runs in its own task: a client that disconnects does not cut it short.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from execstate.identity.secret_ring import SecretRing
from execstate.serve.context import ServeContext
from execstate.serve.errors import OpenAIError, relayed_status
from execstate.serve.sessions.handover import ABORT_PATH, COMMIT_PATH, IDENTIFY_PATH, IMPORT_PATH
from execstate.serve.sessions.handover_wire import IMPORTED, HandoverRequest, answer_verifies, seal_request
from execstate.serve.sessions.targets import MigrationTargets, Target
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.migration_source import Outgoing, begin_export, exportable, finish_export
from execstate.session.runtime.migration import MigrationError
from execstate.transfer.handover import DEFAULT_SKEW_S

MAX_WINDOW_S = 600.0
_GRACE_S = 10.0  # beyond the commit deadline, how long the source waits for the target's answer
_PEER_TIMEOUT_S = 10.0  # identify, commit, abort
_MSGPACK = {"content-type": "application/msgpack"}

logger = logging.getLogger(__name__)


class MigrateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str
    target_api_key: str | None = None  # refused: no credential is sent to another server
    timeout_s: float = 30.0


class Migrations:
    """The sending side of one app: the allow-list and the sessions waiting to be resumed."""

    def __init__(self, sessions: AsyncSessions, targets: MigrationTargets, skew_s: float = DEFAULT_SKEW_S) -> None:
        self.sessions = sessions
        self.targets = targets
        self.skew_s = skew_s
        self._resuming: set[asyncio.Task[None]] = set()

    async def hand_over(self, out: Outgoing, ring: SecretRing, target: Target) -> dict[str, Any]:
        """Deliver, then close and commit, or abort and resume (module docstring); the target's
        answer, or ``MigrationError`` once the source serves the session again (or will)."""
        base = target.base
        try:
            answer = await self._offer(out, base)
        except _NotSent as e:
            await self._finish(out, False)
            raise MigrationError("unreachable", f"{e}; the session is served here") from None
        except MigrationError as e:
            raise await self._abort_then_resume(out, ring, base, e) from None
        if not answer_verifies(ring, "offer", out.nonce, f"{IMPORTED}:{out.session_id}", answer.get("signature")):
            err = MigrationError("refused", "the target's acknowledgement does not verify")
            raise await self._abort_then_resume(out, ring, base, err) from None
        await self._finish(out, True)  # the source's copy is closed: only now may the target serve it
        committed = await self._commit(out, ring, base)
        if not committed:
            raise MigrationError("commit_failed", f"{base} imported session {out.session_id!r} but did not confirm "
                                 "the commit before the offer expired: the session was closed here and is "
                                 "served by neither instance")
        return answer

    async def _offer(self, out: Outgoing, base: str) -> dict[str, Any]:
        timeout = max(1.0, out.commit_by - time.time()) + _GRACE_S
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                resp = await client.post(base + IMPORT_PATH, content=out.payload, headers=_MSGPACK)
        except httpx.ConnectError as e:
            raise _NotSent(f"{base} refused the connection: {e}") from None
        except httpx.TimeoutException:
            raise MigrationError("timeout", f"no answer from {base} within {timeout:.0f} s") from None
        except httpx.HTTPError as e:
            raise MigrationError("unreachable", f"{type(e).__name__}: {e}") from None
        if resp.status_code != 200:
            code, message = _error_of(resp)
            raise MigrationError(code, f"the target refused ({resp.status_code}): {message}")
        try:
            answer = resp.json()
        except ValueError:
            raise MigrationError("refused", "the target's answer is not JSON") from None
        if not isinstance(answer, dict) or answer.get("session_id") != out.session_id:
            raise MigrationError("refused", f"the target answered for another session: {str(answer)[:200]}")
        return answer

    async def _commit(self, out: Outgoing, ring: SecretRing, base: str) -> bool:
        """POST the commit until it is confirmed or the offer expired (backing off)."""
        body = seal_request("commit", HandoverRequest(out.nonce, out.target_engine_id, out.session_id, out.commit_by),
                            ring)
        delay = 0.05
        while True:
            answer = await _post(base + COMMIT_PATH, body)
            if answer is not None and answer_verifies(ring, "commit", out.nonce, "committed", answer.get("signature")):
                return True
            if answer is not None and answer.get("error", {}).get("code") in ("aborted", "expired", "unknown"):
                return False  # the target dropped the import: no retry can commit it
            if time.time() + delay >= out.commit_by:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _abort_then_resume(self, out: Outgoing, ring: SecretRing, base: str,
                                 err: MigrationError) -> MigrationError:
        """Ask the target to abort; resume now if it confirms, else at the offer's expiry + skew."""
        body = seal_request("abort", HandoverRequest(out.nonce, out.target_engine_id, out.session_id, out.commit_by),
                            ring)
        answer = await _post(base + ABORT_PATH, body)
        if answer is not None and answer_verifies(ring, "abort", out.nonce, "aborted", answer.get("signature")):
            await self._finish(out, False)
            return MigrationError(err.code, f"migration to {base} failed ({err.message}); session "
                                  f"{out.session_id!r} is still served here")
        resume_at = out.commit_by + self.skew_s
        task = asyncio.get_running_loop().create_task(self._resume_at(out, resume_at))
        self._resuming.add(task)
        task.add_done_callback(self._resuming.discard)
        return MigrationError(err.code, f"migration to {base} failed ({err.message}) and the target did not "
                              f"confirm the abort: session {out.session_id!r} is served here again in "
                              f"{resume_at - time.time():.0f} s, once the offer expired there (busy until then)")

    async def _resume_at(self, out: Outgoing, when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.time()))
        await self._finish(out, False)
        logger.info("session %s served again after an unconfirmed hand-over expired", out.session_id)

    async def _finish(self, out: Outgoing, ok: bool) -> None:
        await self.sessions.run(lambda s: finish_export(s, out, ok))


class _NotSent(Exception):
    """The offer never reached the target (nothing can have been imported there)."""


async def _post(url: str, body: bytes) -> dict[str, Any] | None:
    """POST a signed hand-over call; its JSON answer (an error body too), None if none came."""
    try:
        async with httpx.AsyncClient(timeout=_PEER_TIMEOUT_S) as client:
            resp = await client.post(url, content=body, headers=_MSGPACK)
        answer = resp.json()
        return answer if isinstance(answer, dict) else None
    except (httpx.HTTPError, ValueError):
        return None


def _error_of(resp: httpx.Response) -> tuple[str, str]:
    try:
        err = resp.json()["error"]
        return str(err.get("code") or "refused"), str(err.get("message") or "")[:500]
    except (ValueError, KeyError, TypeError, AttributeError):
        return "refused", resp.text[:200]


async def identify(base: str, ring: SecretRing) -> str:
    """The engine id of the server at ``base`` (a signed question, a signed answer)."""
    nonce = secrets.token_hex(16)
    answer = await _post(base + IDENTIFY_PATH, seal_request("identify", HandoverRequest(nonce, "", "", 0.0), ring))
    engine_id = answer.get("engine_id") if answer is not None else None
    if not isinstance(engine_id, str) or not answer_verifies(ring, "identify", nonce, engine_id,
                                                             answer.get("signature") if answer else None):
        raise MigrationError("unreachable", f"{base} did not identify itself as an instance sharing this one's secret")
    return engine_id


def install_migration_routes(app: FastAPI, ctx: ServeContext, call: Callable[[Awaitable[Any]], Awaitable[Any]],
                             targets: MigrationTargets, scoped: Callable[[Request], AsyncSessions],
                             skew_s: float = DEFAULT_SKEW_S) -> Migrations:
    engine = ctx.engine
    migrations = Migrations(ctx.sessions, targets, skew_s)

    @app.post("/v1/sessions/{session_id}/migrate")
    async def migrate(session_id: str, body: MigrateBody, request: Request) -> JSONResponse:
        if body.target_api_key is not None:
            raise OpenAIError(400, "target_api_key is not used: instances authenticate each other with their shared "
                              "secret, and no client credential is sent to another server", param="target_api_key")
        if not 0 < body.timeout_s <= MAX_WINDOW_S:
            raise OpenAIError(400, f"timeout_s must be in (0, {MAX_WINDOW_S}]", param="timeout_s")
        target = await call(_resolve(migrations.targets, body.target))
        pd = await call(engine.peer())
        if pd is None or pd.secrets is None:
            raise OpenAIError(400, "this instance cannot send sessions: it needs a PD connector and the shared "
                              "secret of the instances (kv_secret / EXECSTATE_KV_SECRET)", code="unsupported")
        ring: SecretRing = pd.secrets
        sessions = scoped(request)
        access = sessions.access
        # the caller's own session, before any outbound call: another tenant's or an unknown id is a 404
        await call(sessions.run(lambda s: exportable(s, session_id, access)))
        engine_id = target.engine_id or await call(identify(target.base, ring))
        nonce = secrets.token_hex(16)
        out: Outgoing = await call(sessions.run(lambda s: begin_export(
            s, session_id, body.timeout_s, target_engine_id=engine_id, nonce=nonce, access=access)))
        task = asyncio.ensure_future(migrations.hand_over(out, ring, target))
        try:
            answer = await asyncio.shield(task)
        except MigrationError as e:
            raise OpenAIError(relayed_status(e.code), e.message, code=e.code) from None
        answer.update(status="migrated", committed=True, target=target.base, target_engine_id=engine_id,
                      seconds=time.monotonic() - out.started, checkpoints_dropped=out.checkpoints_left)
        for k in ("signature", "nonce", "state"):
            answer.pop(k, None)
        return JSONResponse(answer)

    return migrations


async def _resolve(targets: MigrationTargets, target: str) -> Target:
    return targets.resolve(target)

