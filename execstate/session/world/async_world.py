"""World sessions for an asyncio server (the realtime WebSocket endpoint calls this)::

    aw = AsyncWorld(world)                       # world: execstate.World
    info = await aw.open(prompt="a meadow maze", seed=0, scene_seed=3)    # WorldSessionInfo
    ack = await aw.submit_event(info.session_id, 7, "key", {"key": "left", "down": True})
    r = await aw.step(info.session_id)           # WorldStepResult (frames uint8 [F, H, W, 3])
    cp = await aw.checkpoint(sid); await aw.rollback(sid, cp); await aw.release_checkpoint(sid, cp)
    fork = await aw.fork(sid, cp or None, new_session_id=None)           # WorldSessionInfo
    await aw.reset(sid); await aw.close(sid); await aw.info(sid); await aw.list()
    await aw.hibernate(sid); await aw.wake(sid)  # session/world/hibernation.py; any later call wakes it too
    await aw.shutdown()                          # closes every session, stops the worker threads

Steps run on worker threads (``step_workers``, default 1: on a small CPU one chunk at a time is
fastest, torch already uses every core), so the event loop never blocks on a chunk. Every other
call runs at once (``run``) and takes the sessions' lock only for its bookkeeping (microseconds;
never for a chunk's compute, ``session/world/sessions.py``): an event submitted while its
session's step is being computed is accepted at once and applies at the next boundary. The
shared operations are ``AsyncKindSessions``' (``session/runtime/async_sessions.py``). ``submit_event`` records when
each event arrived (``received_at``, ``time.perf_counter``) for event-to-action latency.

Errors are ``SessionEventError`` with a ``code`` (``docs/world-sessions.md``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from execstate.model.world.interface import WorldSpec
from execstate.session.runtime.access import LOCAL, Access
from execstate.session.runtime.async_sessions import AsyncKindSessions
from execstate.session.runtime.events import EventAck, SessionEventError
from execstate.session.runtime.lifecycle import SessionStatus
from execstate.session.world.hibernation import hibernate, wake
from execstate.session.world.offline import World, scene_frames
from execstate.session.world.sessions import WorldSessionInfo, WorldSessions
from execstate.session.world.step import WorldStepResult

_REMEMBER_ARRIVALS = 4096
T = TypeVar("T")


class AsyncWorld(AsyncKindSessions[WorldSessions, WorldSessionInfo]):
    def __init__(self, world: World, step_workers: int = 1) -> None:
        if isinstance(step_workers, bool) or not isinstance(step_workers, int) or step_workers < 1:
            raise ValueError(f"step_workers must be an int >= 1, got {step_workers!r}")
        self.world = world
        self.sessions = world.sessions
        self.access: Access = LOCAL
        self._pool = ThreadPoolExecutor(step_workers, thread_name_prefix="world-step")
        self.received_at: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._in_flight: set[tuple[object, str]] = set()

    def scoped(self, access: Access) -> AsyncWorld:
        """A view asking as ``access`` (``session/runtime/async_sessions.py``); it shares the workers."""
        view = object.__new__(AsyncWorld)
        view.__dict__.update(self.__dict__)
        view.access = access
        return view

    @property
    def spec(self) -> WorldSpec:
        return self.world.spec

    async def open(self, prompt: str = "", seed: int = 0, start_frames: np.ndarray | None = None,
                   scene_seed: int | None = None, session_id: str | None = None, window_chunks: int | None = None,
                   sink_chunks: int | None = None) -> WorldSessionInfo:
        if scene_seed is not None:
            if start_frames is not None:
                raise SessionEventError("invalid", "give start_frames or scene_seed, not both")
            start_frames = scene_frames(self.spec, scene_seed, prompt)

        a = self.access

        def fn() -> WorldSessionInfo:
            rt = self.sessions.open(session_id, prompt, seed, start_frames, window_chunks, sink_chunks, a)
            return self.sessions.info(rt.session_id, a)

        return await self._in_worker(fn)  # committing the start frames runs the model once

    async def submit_event(self, session_id: str, event_id: int, kind: str, data: Any = None) -> EventAck:
        t = time.perf_counter()
        ack = self.sessions.submit_event(session_id, event_id, kind, data, self.access)
        if not ack.duplicate:
            self.received_at[(session_id, ack.event_id)] = t
            while len(self.received_at) > _REMEMBER_ARRIVALS:
                self.received_at.popitem(last=False)
        return ack

    async def step(self, session_id: str, action: str | list[str] | None = None) -> WorldStepResult:
        """One chunk. Its boundary (which events it applies) is taken when a worker starts it; a
        second step of a session whose step is queued or running is refused ``busy`` at once."""
        a = self.access
        self.sessions.runtime(session_id, a).require(SessionStatus.OPEN)
        key = (a.owner, session_id)
        if key in self._in_flight:
            raise SessionEventError("busy", f"session {session_id!r} has a step queued or running")
        self._in_flight.add(key)
        try:
            return await self._in_worker(lambda: self.sessions.step(session_id, action, a))
        finally:
            self._in_flight.discard(key)

    async def hibernate(self, session_id: str) -> WorldSessionInfo:
        """Sleep (``session/world/hibernation.py``): encoding and writing the unit runs on a worker."""
        a = self.access
        return await self._in_worker(lambda: (hibernate(self.sessions, session_id, a),
                                              self.sessions.info(session_id, a))[1])

    async def wake(self, session_id: str) -> WorldSessionInfo:
        """Wake now (any other call would too; reading and checking the unit runs on a worker)."""
        a = self.access
        return await self._in_worker(lambda: (wake(self.sessions, session_id, a), self.sessions.info(session_id, a))[1])

    async def run(self, fn: Callable[[WorldSessions], T]) -> T:
        """``fn(sessions)`` now: it takes the sessions' lock for its bookkeeping only."""
        return fn(self.sessions)

    async def shutdown(self) -> None:
        """Close every session and stop the workers (a step in flight finishes, then is discarded)."""
        self.sessions.close_all()
        await asyncio.get_running_loop().run_in_executor(None, lambda: self._pool.shutdown(wait=True))

    async def _in_worker(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

