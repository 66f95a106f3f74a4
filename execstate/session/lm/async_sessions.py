"""LM sessions over an ``AsyncEngine``: the API a realtime front (WebSocket) calls.

Every operation is a command executed on the engine thread between steps (``LMSessions``,
``session/lm/sessions.py``), so nothing blocks the event loop and sessions never race with the
engine. The shared operations are ``AsyncKindSessions``' (``session/runtime/async_sessions.py``).
Text is tokenised in a worker thread, never on the engine thread::

    sessions = AsyncSessions(async_engine)
    info = await sessions.open(session_id=None, sampling_params=SamplingParams(...))  # SessionInfo
    ack = await sessions.submit_event(sid, event_id=7, kind="input", data={"text": "..."})
    async for item in sessions.step(sid, input=[...] or "text", max_tokens=16):
        ...  # StepDelta (new tokens and text) as they come, then the StepResult, last
    await sessions.cancel(sid)               # the step in flight ends with finish_reason "abort"
    cp = await sessions.checkpoint(sid)      # a checkpoint id (str)
    await sessions.rollback(sid, cp); await sessions.release_checkpoint(sid, cp)
    fork = await sessions.fork(sid, cp or None, new_session_id=None)   # SessionInfo
    await sessions.reset(sid); await sessions.close(sid)
    await sessions.info(sid); await sessions.list()
    await sessions.token_ids(sid); await sessions.routed_experts(sid)
    await sessions.hibernate(sid); await sessions.wake(sid)   # session/lm/hibernation.py

Errors are ``SessionEventError`` with a ``code`` (``session/lm/sessions.py``); a failed step
raises it (code ``failed``) from the ``step`` iterator after the deltas it produced. Closing the
``step`` iterator early cancels the step (the session keeps what was generated). Session ids are
strings (``session/runtime/manager.py``), checkpoints are referred to by their ids. When the
``AsyncEngine`` shuts down, every session is closed and its state released.

Ownership: an ``AsyncSessions`` owns the engine's ``LMSessions`` (built on the engine thread by its
first call); an engine has at most one, so build one ``AsyncSessions`` per engine and pass it to
every part that opens sessions on it (the server's surfaces share the app's: ``ServeContext.sessions``).
``run(fn)`` / ``call(fn)`` run ``fn(lm_sessions)`` on the engine thread (e.g. a migration's phases).
``scoped(access)`` is a view asking as another caller (``session/runtime/async_sessions.py``): a
server's surfaces use one per caller, so ids resolve in the caller's namespace; ``policy`` (the
server's ``SessionPolicy``: idle expiry, quotas, checkpoints per session) applies to the engine's
``LMSessions`` when the first call builds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

import numpy as np

from execstate.engine.async_engine import AsyncEngine, EngineOwned
from execstate.engine.priority import PRIORITY_INTERACTIVE
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.scope import PrefixSharing
from execstate.session.lm.chat import ChatTurn, turn_tokens
from execstate.session.lm.events import INPUT, pretokenize
from execstate.session.lm.hibernation import (
    REFERENCE_TTL_S,
    Hibernated,
    hibernate,
    hibernate_idle,
    reference,
    wake,
)
from execstate.session.lm.migration_target import ImportHandle
from execstate.session.lm.sessions import LMSessions, SessionInfo
from execstate.session.lm.step import StepDelta, StepHandle, StepResult
from execstate.session.runtime.access import LOCAL, Access
from execstate.session.runtime.async_sessions import AsyncKindSessions, checkpoint_id_of
from execstate.session.runtime.events import EventAck, SessionEventError
from execstate.session.runtime.manager import SessionPolicy

T = TypeVar("T")


class AsyncSessions(AsyncKindSessions[LMSessions, SessionInfo]):
    def __init__(self, engine: AsyncEngine, policy: SessionPolicy | None = None,
                 sharing: PrefixSharing | None = None) -> None:
        self.engine = engine
        self.access: Access = LOCAL
        # the engine's LMSessions, built on the engine thread by the first call, shared by every view
        self._home: EngineOwned[LMSessions] = engine.own_sessions(LMSessions.builder(policy, sharing),
                                                                     LMSessions.close_all)

    def scoped(self, access: Access) -> AsyncSessions:
        view = object.__new__(AsyncSessions)
        view.engine, view.access, view._home = self.engine, access, self._home
        return view

    async def run(self, fn: Callable[[LMSessions], T]) -> T:
        """``fn(lm_sessions)`` on the engine thread, between two engine steps."""
        return await self._home.run(fn)

    def call(self, fn: Callable[[LMSessions], T], timeout: float | None = None) -> T:
        """Blocking :meth:`run` for plain threads (start-up, tests); never on the event loop."""
        return self._home.call(fn, timeout)

    # -- hand-overs in (session/lm/migration_target.py; serve/sessions/handover.py) ------------------
    async def commit_import(self, handle: ImportHandle) -> None:
        """Serve an imported session from now on (``ImportHandle.commit``, on the engine thread);
        ``MigrationError("aborted")`` when it was abandoned or ended meanwhile."""
        await self.run(lambda s: handle.commit())

    async def abandon_import(self, handle: ImportHandle, why: str) -> None:
        """Drop an import not committed (``ImportHandle.abandon``, on the engine thread)."""
        await self.run(lambda s: handle.abandon(why))

    # -- lifecycle --------------------------------------------------------------------------------
    async def open(self, session_id: str | None = None, sampling_params: SamplingParams | None = None,
                   priority: int = PRIORITY_INTERACTIVE, cache_salt: str | None = None) -> SessionInfo:
        a = self.access

        def fn(s: LMSessions) -> SessionInfo:
            return s.info(s.open(session_id, sampling_params, priority, cache_salt, a).session_id, a)

        return await self.run(fn)

    async def truncate(self, session_id: str, checkpoint_id: str, num_tokens: int) -> None:
        """``LMSessions.truncate``: back to the checkpoint, keeping the context's first ``num_tokens``."""
        cp, a = checkpoint_id_of(checkpoint_id), self.access
        await self.run(lambda s: s.truncate(session_id, cp, num_tokens, a))

    # -- events and steps -------------------------------------------------------------------------
    async def submit_event(self, session_id: str, event_id: int, kind: str, data: Any = None) -> EventAck:
        data = await asyncio.to_thread(pretokenize, kind, data, self.engine.tokenizer)
        a = self.access
        return await self.run(lambda s: s.submit_event(session_id, event_id, kind, data, a))

    async def step(self, session_id: str, input: list[int] | str | ChatTurn | None = None,
                   max_tokens: int | None = None, reprefill: bool = False,
                   on_start: Callable[[int, dict[str, list[int]]], None] | None = None,
                   ) -> AsyncGenerator[StepDelta | StepResult, None]:
        """Submit ``input`` (if any) and run one step: yields ``StepDelta``s, then the ``StepResult``.
        A ``ChatTurn`` is rendered with the model's chat template, one turn at a time (``chat.py``;
        a bad turn: ``SessionEventError`` ``invalid``), in a worker thread.

        ``on_start(step_index, events)`` is called on the caller's event loop once the step has
        begun (its boundary drained the pending events), before its first delta; a step refused
        at its start raises before it is called."""
        loop = asyncio.get_running_loop()
        a = self.access
        if isinstance(input, ChatTurn):
            last = await self.run(lambda s: s.last_token(session_id, a))
            try:
                input = await asyncio.to_thread(turn_tokens, self.engine.tokenizer, input.messages, last)
            except ValueError as exc:
                raise SessionEventError("invalid", f"messages: {exc}") from None
        if isinstance(input, str):
            first = await self.run(lambda s: s.first_input(session_id, a))
            data = await asyncio.to_thread(pretokenize, INPUT, {"text": input, "add_special_tokens": first},
                                           self.engine.tokenizer)
            input = data["token_ids"] if isinstance(data, dict) and "token_ids" in data else input
        handles: list[StepHandle] = []

        def start(lm: LMSessions) -> str:
            handle = lm.start_step(session_id, input, max_tokens, reprefill, stream=True, access=a)
            handles.append(handle)
            if on_start is not None:  # scheduled before any output of the request can be delivered
                loop.call_soon_threadsafe(on_start, handle.step_index, handle.events)
            return handle.request_id

        async for out in self._home.stream(start):
            c = out.outputs[0]
            if c.token_ids or c.text:
                yield StepDelta(session_id, handles[0].step_index, list(c.token_ids), c.text)
        handle = handles[0]
        if not handle.done:  # the engine finished the request, so its hook ran: never expected
            raise SessionEventError("failed", f"step {handle.step_index} of session {session_id!r} ended unsettled")
        if handle.error is not None:
            raise handle.error
        assert handle.result is not None
        yield handle.result

    async def cancel(self, session_id: str) -> bool:
        """Cancel the step in flight; False if there is none."""
        a = self.access
        return await self.run(lambda s: s.cancel(session_id, a))

    # -- queries ------------------------------------------------------------------------------------
    async def token_ids(self, session_id: str) -> list[int]:
        a = self.access
        return await self.run(lambda s: s.token_ids(session_id, a))

    async def routed_experts(self, session_id: str) -> np.ndarray | None:
        a = self.access
        return await self.run(lambda s: s.routed_experts(session_id, a))

    # -- hibernation (session/lm/hibernation.py) -----------------------------------------------------
    async def hibernate(self, session_id: str) -> SessionInfo:
        """Put the session to sleep (its blocks in the tiers, its pool blocks released), then
        publish its manifest to the shared tier, if any, in a worker thread; its info."""
        a = self.access

        def fn(s: LMSessions) -> tuple[Hibernated, Any, SessionInfo]:
            rec = hibernate(s, session_id, a)
            conn = s.engine.offload
            return rec, (conn.flush if conn is not None else None), s.info(session_id, a)

        record, flush, info = await self.run(fn)
        if not record.published:
            await asyncio.to_thread(record.publish, flush)
        return info

    async def hibernate_idle(self) -> int:
        """Hibernate the sessions idle past the policy's ``hibernate_after_s``; how many."""
        records = await self.run(lambda s: (hibernate_idle(s), s.engine.offload))
        flush = records[1].flush if records[1] is not None else None
        for rec in records[0]:
            await asyncio.to_thread(rec.publish, flush)
        return len(records[0])

    async def wake(self, session_id: str) -> SessionInfo:
        a = self.access
        return await self.run(lambda s: s.describe(wake(s, session_id, a)))

    async def reference(self, session_id: str, target_engine_id: str, ttl_s: float = REFERENCE_TTL_S) -> bytes:
        """A signed reference for ``target_engine_id`` to wake the hibernated session there."""
        a = self.access
        return await self.run(lambda s: reference(s, session_id, a, target_engine_id, ttl_s))

    async def usage(self) -> tuple[dict[Any, dict[str, Any]], int]:
        """Per tenant, what the engine's sessions hold (``LMSessions.usage``; every owner's), and
        how many sessions expired since start."""
        return await self.run(lambda s: (s.usage(), s.manager.num_expired))

