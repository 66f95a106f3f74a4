"""The handlers of ``/v1/realtime`` (LM sessions over ``AsyncSessions``): one per message struct.

The framework (``serve/realtime/connection.py``) decodes each frame, checks the phase
(``messages.py``'s ``PHASES``), calls the message's handler here, in arrival order and one at a
time, and turns what a handler raises into an ``error`` event. Contract:

- Every client message gets at least one answer carrying its ``event_id``: its acknowledgement,
  ``response.created`` (then ``response.delta``\\ s and exactly one ``response.done``), or an
  ``error`` with a code. ``response.cancel`` is answered by the ``response.done`` of the response
  it cancels (``cancelled``, or ``completed`` when the step finished first).
- Order: messages are acted on in arrival order. ``handle`` returns once a message is acted on;
  for ``response.create`` that is once the step has begun (its boundary drained the events
  submitted before it), so an ``event.submit`` sent after ``response.create`` is applied at the
  next step, as offline. The step then streams from its own task while ``handle`` takes the next
  messages (``event.submit``, ``response.cancel``, ``session.get``, ``session.close`` work
  mid-step; the rest get ``response_in_progress``: ``messages.py``).
- ``response.done`` carries ``status`` ``completed`` / ``cancelled`` (``response.cancel``, or the
  session closed mid-step) / ``failed`` (the step failed: the session is FAILED, only
  ``session.reset`` and ``session.close`` work); its ``token_ids`` are the concatenation of the
  response's deltas.
- ``close()`` (after the last message, when the socket is gone): the response in progress is
  cancelled and awaited, then ``SessionOwners.disconnect`` closes or detaches the connection's
  sessions. A message being handled is never interrupted, so no session opened or forked for this
  connection is lost.
- Nothing here blocks the event loop: session calls run on the engine thread, text is tokenised
  and route rows are encoded in worker threads.
- Ownership: the handlers ask as the connection's tenant (``peer.tenant``), holder ``realtime``
  (:func:`realtime_access`), through one scoped view of the sessions built here: every id
  resolves in that tenant's namespace (another tenant's session, or an agent's front, is
  ``not_found``), and what the connection creates, forks or resumes is held by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from execstate.engine.async_engine import EngineDeadError
from execstate.identity.tenant import TenantId
from execstate.serve.realtime.connection import Handler, Peer
from execstate.serve.realtime.lm.convert import (
    done_json,
    event_data,
    invalid,
    response_json,
    session_json,
    session_options,
    session_params,
    step_input,
)
from execstate.serve.realtime.lm.messages import (
    ATTACH,
    BEGIN_RESPONSE,
    DETACH,
    END_RESPONSE,
    READY,
    RESPONDING,
    CheckpointRelease,
    EventSubmit,
    ResponseCancel,
    ResponseCreate,
    SessionCheckpoint,
    SessionClose,
    SessionCreate,
    SessionFork,
    SessionGet,
    SessionReset,
    SessionResume,
    SessionRollback,
)
from execstate.serve.realtime.lm.owners import SessionOwners
from execstate.serve.realtime.messages import server_event
from execstate.serve.route_rows import encode_routes
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.chat import ChatTurn
from execstate.session.lm.step import StepDelta, StepResult
from execstate.session.runtime.access import SESSIONS, Access, Owner
from execstate.session.runtime.events import SessionEventError

InWorker = Callable[..., Awaitable[Any]]
REALTIME_HOLDER = "realtime"


def realtime_access(tenant: TenantId) -> Access:
    """How a ``/v1/realtime`` connection of ``tenant`` asks: the session API's realm, held by ``realtime``."""
    return Access(Owner(tenant, SESSIONS), REALTIME_HOLDER)


class LMHandlers:
    def __init__(self, peer: Peer, sessions: AsyncSessions, owners: SessionOwners, in_worker: InWorker) -> None:
        self.emit = peer.emit
        self.state = peer.state
        self.tenant = peer.tenant
        self.sessions = sessions.scoped(realtime_access(peer.tenant))
        self.owners = owners
        self.in_worker = in_worker
        self.conn = owners.new_connection()
        self.return_routes = False  # the attached session's default for response.done
        self._response: asyncio.Task[None] | None = None
        self.routes: dict[type, Handler] = {
            SessionCreate: self._create, SessionResume: self._resume, SessionGet: self._get,
            EventSubmit: self._submit, ResponseCreate: self._respond, ResponseCancel: self._cancel,
            SessionCheckpoint: self._checkpoint, SessionRollback: self._rollback, SessionReset: self._reset,
            CheckpointRelease: self._release, SessionFork: self._fork, SessionClose: self._close,
        }

    async def close(self) -> None:
        """Cancel the response in progress, then close or detach the connection's sessions."""
        task = self._response
        if task is not None and not task.done():
            sid = self.state.values["session_id"]
            if sid is not None:
                with contextlib.suppress(SessionEventError, EngineDeadError):
                    await self.sessions.cancel(sid)
            await asyncio.wait({task})
        await self.owners.disconnect(self.conn)

    # -- sessions -----------------------------------------------------------------------------------
    async def _create(self, msg: SessionCreate) -> None:
        cfg = msg.session
        params = session_params(cfg)
        priority, cache_salt = session_options(cfg)
        self._check_routes(cfg.return_routes)
        info = await self.sessions.open(cfg.id, params, priority, cache_salt)
        self.owners.claim(self.conn, self._key(info.session_id), cfg.return_routes, attach=True)
        self._attach(info.session_id, cfg.return_routes)
        await self.emit(server_event("session.created", msg.event_id,
                                     session=session_json(info, cfg.return_routes, checkpoints=True)))

    async def _resume(self, msg: SessionResume) -> None:
        sid = msg.session_id
        return_routes = self.owners.resume(self.conn, self._key(sid), msg.event_id)
        try:
            info = await self.sessions.info(sid)
            if info.status in ("closed", "evicted", "expired"):
                raise SessionEventError(info.status, f"session {sid!r} is {info.status}: {info.error or 'closed'}")
            await self.sessions.hold(sid)  # from now on the HTTP API gets session_in_use for it
        except BaseException:
            self.owners.forget(self._key(sid))
            raise
        self._attach(sid, return_routes)
        await self.emit(server_event("session.resumed", msg.event_id,
                                     session=session_json(info, return_routes, checkpoints=True)))

    async def _get(self, msg: SessionGet) -> None:
        sid = self._sid()
        info = await self.sessions.info(sid)
        fields: dict[str, Any] = {"session": session_json(info, self.return_routes, checkpoints=True),
                                  "token_ids": await self.sessions.token_ids(sid)}
        if self.return_routes:
            fields["routed_experts"] = await self.in_worker(encode_routes, await self.sessions.routed_experts(sid))
        await self.emit(server_event("session.info", msg.event_id, **fields))

    async def _close(self, msg: SessionClose) -> None:
        sid = self._sid()
        try:
            await self.sessions.close(sid)
        except SessionEventError as e:
            if e.code != "not_found":  # long gone: nothing left to release
                raise
        if self._response is not None:
            await asyncio.wait({self._response})  # it ends with its response.done (cancelled)
            self._response = None
        self.owners.forget(self._key(sid))
        self.state.move(DETACH)
        self.return_routes = False
        await self.emit(server_event("session.closed", msg.event_id, session_id=sid))

    # -- events and responses -----------------------------------------------------------------------
    async def _submit(self, msg: EventSubmit) -> None:
        ack = await self.sessions.submit_event(self._sid(), msg.event_id, msg.kind, event_data(msg.kind, msg.data))
        await self.emit(server_event("event.accepted", ack.event_id, kind=ack.kind, status=ack.status,
                                     duplicate=ack.duplicate))

    async def _respond(self, msg: ResponseCreate) -> None:
        sid = self._sid()
        value = step_input(msg.input)
        want_routes = self.return_routes if msg.return_routes is None else msg.return_routes
        self._check_routes(want_routes)
        rid = f"resp-{secrets.token_hex(6)}"
        started: asyncio.Future[tuple[int, dict[str, list[int]]]] = asyncio.get_running_loop().create_future()
        created = asyncio.Event()
        task = asyncio.create_task(self._run_response(msg, sid, rid, value, want_routes, started, created))
        waiting: set[asyncio.Future[Any]] = {started, task}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()  # ended without starting: re-raise what stopped it
            raise invalid("the step ended before it started")
        refused = started.exception()
        if refused is not None:  # refused at the start: nothing ran
            raise refused
        self._response = task
        step_index, events = started.result()
        try:
            if self.state.phase is READY:
                self.state.move(BEGIN_RESPONSE, response_id=rid)
                await self.emit(server_event("response.created", msg.event_id,
                                             response=response_json(rid, sid, "in_progress", step_index, events)))
        finally:
            created.set()  # the task's events follow response.created

    async def _run_response(self, msg: ResponseCreate, sid: str, rid: str, value: list[int] | str | ChatTurn | None,
                            want_routes: bool, started: asyncio.Future[tuple[int, dict[str, list[int]]]],
                            created: asyncio.Event) -> None:
        """The step's task: deltas as they come, then exactly one ``response.done``."""
        def on_start(step_index: int, events: dict[str, list[int]]) -> None:
            if not started.done():
                started.set_result((step_index, events))

        tokens: list[int] = []
        texts: list[str] = []
        result: StepResult | None = None
        error: SessionEventError | None = None
        try:
            steps = self.sessions.step(sid, value, msg.max_tokens, msg.reprefill, on_start=on_start)
            async with contextlib.aclosing(steps):
                async for item in steps:
                    await created.wait()
                    if isinstance(item, StepDelta):
                        tokens.extend(item.token_ids)
                        texts.append(item.text)
                        await self.emit(server_event("response.delta", None, response_id=rid,
                                                     step_index=item.step_index, token_ids=item.token_ids,
                                                     text=item.text))
                    else:
                        result = item
        except (SessionEventError, EngineDeadError) as exc:
            if not started.done():
                started.set_exception(exc)
                return
            error = exc if isinstance(exc, SessionEventError) else SessionEventError("engine_dead", str(exc))
        await created.wait()
        try:
            await self.emit(await self._done(msg, sid, rid, started.result(), result, tokens, "".join(texts), error,
                                             want_routes))
        finally:
            if self.state.phase is RESPONDING and self.state.values["response_id"] == rid:
                self.state.move(END_RESPONSE, response_id=None)

    async def _done(self, msg: ResponseCreate, sid: str, rid: str, start: tuple[int, dict[str, list[int]]],
                    result: StepResult | None, tokens: list[int], text: str, error: SessionEventError | None,
                    want_routes: bool) -> dict[str, Any]:
        routes = None
        if want_routes and result is not None and result.routed_experts is not None:
            routes = await self.in_worker(encode_routes, result.routed_experts)
        response = done_json(rid, sid, start[0], start[1], result, tokens, text, error, routes, want_routes)
        return server_event("response.done", msg.event_id, response=response)

    async def _cancel(self, msg: ResponseCancel) -> None:
        # Answered by the response's response.done (cancelled, or completed if the step ended first).
        await self.sessions.cancel(self._sid())

    # -- checkpoints and forks ----------------------------------------------------------------------
    async def _checkpoint(self, msg: SessionCheckpoint) -> None:
        sid = self._sid()
        cp = await self.sessions.checkpoint(sid)
        info = await self.sessions.info(sid)
        await self.emit(server_event("session.checkpointed", msg.event_id, checkpoint_id=cp,
                                     session=session_json(info, self.return_routes)))

    async def _rollback(self, msg: SessionRollback) -> None:
        sid = self._sid()
        await self.sessions.rollback(sid, msg.checkpoint_id)
        info = await self.sessions.info(sid)
        await self.emit(server_event("session.rolled_back", msg.event_id, checkpoint_id=msg.checkpoint_id,
                                     session=session_json(info, self.return_routes)))

    async def _reset(self, msg: SessionReset) -> None:
        sid = self._sid()
        await self.sessions.reset(sid)
        info = await self.sessions.info(sid)
        await self.emit(server_event("session.reset_done", msg.event_id,
                                     session=session_json(info, self.return_routes)))

    async def _release(self, msg: CheckpointRelease) -> None:
        await self.sessions.release_checkpoint(self._sid(), msg.checkpoint_id)
        await self.emit(server_event("checkpoint.released", msg.event_id, checkpoint_id=msg.checkpoint_id))

    async def _fork(self, msg: SessionFork) -> None:
        sid = self._sid()
        info = await self.sessions.fork(sid, msg.checkpoint_id, msg.session_id)
        self.owners.claim(self.conn, self._key(info.session_id), self.return_routes, attach=False)
        await self.emit(server_event("session.forked", msg.event_id, parent_session_id=sid,
                                     session=session_json(info, self.return_routes, checkpoints=True)))

    # -- helpers ----------------------------------------------------------------------------------
    def _key(self, session_id: str) -> tuple[TenantId, str]:
        return (self.tenant, session_id)

    def _attach(self, session_id: str, return_routes: bool) -> None:
        self.state.move(ATTACH, session_id=session_id)
        self.return_routes = return_routes

    def _sid(self) -> str:
        sid = self.state.values["session_id"]
        assert sid is not None  # the phase check let the message through
        return sid

    def _check_routes(self, want: bool) -> None:
        if want and not self.sessions.engine.return_routes:
            raise invalid("this server does not return routes (start it with --enable-return-routed-experts)")
