"""One world-session connection: client frames in, server events and chunks out (no server needed).

The endpoint (``world_ws.py``) feeds every client frame to ``handle`` in arrival order; ``emit``
sends a JSON event, ``emit_chunk`` a chunk's ``video.chunk_metadata`` and its binary frame back to
back (one writer: nothing interleaves). Contract:

- Every client message gets an answer carrying its ``event_id``: ``video.start``,
  ``session.interaction.queued`` (also for ``key.down``/``key.up``), ``session.paused``,
  ``session.resumed``, ``session.checkpointed``, ``session.rolled_back``, ``checkpoint.released``,
  ``session.pong``, ``session.done``, or an ``error`` with a code (the connection stays open).
- After ``video.start`` the session's *stepper* task streams chunks: chunk 0 at once, then one
  chunk per ``F / fps`` seconds, at most one chunk ahead of real time (``fps: 0``: back to back).
  Events are applied at the boundary before each step (``world_events.py``): an event that
  arrives while a step runs is applied at the next one. A chunk later than its real-time slot by
  more than one chunk's duration is reported with ``session.behind`` (``behind_ms``: how late; at
  most once a second while behind); every chunk's metadata carries ``behind_ms``.
- Pause takes effect at the next boundary (the step in progress is delivered); the real-time clock
  stops while paused. ``session.stop`` lets the step in progress finish, then ``session.done``.
- Checkpoint, rollback and release run between steps (they wait for the step in progress).
- A failed step ends the session: ``error`` (``step_failed``) then ``session.done``.
- ``close()`` (the socket is gone): the stepper stops after its step, the session is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from execstate.serve.world_convert import StartConfig, chunk_metadata, interaction_parts, start_config
from execstate.serve.world_driver import WorldCapacityError, WorldDriver, WorldHost
from execstate.serve.world_encode import EncodedChunk, encode_chunk
from execstate.serve.world_events import Boundary, BoundaryEvents
from execstate.serve.world_protocol import (
    CheckpointRelease,
    KeyDown,
    KeyUp,
    SessionCheckpoint,
    SessionInteraction,
    SessionPause,
    SessionPing,
    SessionResume,
    SessionRollback,
    SessionStart,
    SessionStop,
    WorldProtocolError,
    error_event,
    parse_client_message,
    type_of,
)
from execstate.serve.world_state import Phase, WorldConnState

Emit = Callable[[dict[str, Any]], Awaitable[None]]
EmitChunk = Callable[[dict[str, Any], bytes], Awaitable[None]]
BEHIND_REPORT_S = 1.0

logger = logging.getLogger(__name__)


@dataclass
class _Live:
    """One running session of this connection."""

    driver: WorldDriver
    cfg: StartConfig
    events: BoundaryEvents
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # driver use: one at a time
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # pause/resume/stop changed
    paused: bool = False
    stopping: bool = False
    chunks: int = 0
    frames: int = 0
    origin: float | None = None  # when chunk 0 was delivered, shifted by the time spent paused
    paused_at: float | None = None
    behind_reported_at: float | None = None
    task: asyncio.Task[None] | None = None


class WorldConnection:
    def __init__(self, host: WorldHost, emit: Emit, emit_chunk: EmitChunk) -> None:
        self.host = host
        self.emit = emit
        self.emit_chunk = emit_chunk
        self.state = WorldConnState()
        self.live: _Live | None = None
        self._ids = itertools.count()
        self._handlers: dict[type, Callable[[Any], Awaitable[None]]] = {
            SessionStart: self._start, SessionInteraction: self._interaction, KeyDown: self._key_down,
            KeyUp: self._key_up, SessionPause: self._pause, SessionResume: self._resume,
            SessionCheckpoint: self._checkpoint, SessionRollback: self._rollback, CheckpointRelease: self._release,
            SessionPing: self._ping, SessionStop: self._stop,
        }

    @property
    def request_id(self) -> str | None:
        return self.state.request_id

    async def handle(self, frame: str | bytes, binary: bool = False) -> None:
        """Act on one client frame; every outcome is emitted, nothing raises."""
        if self.state.phase is Phase.GONE:
            return
        event_id = None
        try:
            if binary:
                raise WorldProtocolError("invalid_message", "binary frames are not accepted: send each message as "
                                         "one JSON text frame")
            msg = parse_client_message(frame)
            event_id = msg.event_id
            self.state.check(type_of(msg), event_id)
            await self._handlers[type(msg)](msg)
        except WorldProtocolError as e:
            await self.emit(error_event(e.code, e.message, e.event_id, self.request_id))
        except WorldCapacityError as e:
            await self.emit(error_event(e.code, e.message, event_id, self.request_id))
        except Exception as e:  # a bug: reported to this client; the connection and the server go on
            logger.exception("world: unexpected error handling a message")
            await self.emit(error_event("server_error", f"internal error: {e!r}", event_id, self.request_id))

    async def reject(self, error: WorldProtocolError) -> None:
        if self.state.phase is not Phase.GONE:
            await self.emit(error_event(error.code, error.message, error.event_id, self.request_id))

    async def close(self) -> None:
        """The socket is gone: stop the stepper after its step and release the session."""
        self.state.gone()
        await self._end_session()

    # -- session life -------------------------------------------------------------------------------
    async def _start(self, msg: SessionStart) -> None:
        spec = self.host.model.spec
        cfg = start_config(msg, spec, self.host.model_name, self.host.default_fps)
        try:
            driver = await self.host.run(self.host.open, cfg.seed, cfg.prompt, cfg.window_chunks)
        except ValueError as e:
            raise WorldProtocolError("invalid_message", f"session.start: {e}", msg.event_id) from None
        live = _Live(driver, cfg, BoundaryEvents(spec.keys))
        self.live = live
        self.state.started(driver.session_id)
        h, w, c = spec.frame_shape
        await self.emit({"type": "video.start", "request_id": driver.session_id, "event_id": msg.event_id,
                         "format": cfg.format, "config": {
                             "model": self.host.model_name, "prompt": cfg.prompt, "seed": cfg.seed, "fps": cfg.fps,
                             "width": w, "height": h, "channels": c, "frames_per_chunk": spec.frames_per_chunk,
                             "num_inference_steps": len(spec.schedule), "keys": list(spec.keys[1:]),
                             "start": cfg.start, "num_frames": cfg.num_frames,
                             "window_chunks": driver.rollout.window.window_chunks,
                             "memory_bytes": driver.memory_bytes, "weights_version": spec.weights_version}})
        live.task = asyncio.create_task(self._stepper(live, time.perf_counter()))

    async def _stop(self, msg: SessionStop) -> None:
        await self._end_session(msg.event_id, stopped=True)

    async def _end_session(self, event_id: Any = None, stopped: bool = True) -> None:
        live = self.live
        if live is None:
            return
        live.stopping = True
        live.wake.set()
        if live.task is not None and live.task is not asyncio.current_task():
            await asyncio.wait({live.task})
        if self.live is not live:
            return  # the stepper ended it meanwhile
        self.live = None
        async with live.lock:
            self.host.close(live.driver)
        rid = self.request_id
        self.state.done()
        if self.state.phase is not Phase.GONE:
            await self.emit({"type": "session.done", "request_id": rid, "event_id": event_id, "chunks": live.chunks,
                             "frames": live.frames, "stopped": stopped})

    # -- events -------------------------------------------------------------------------------------
    def _eid(self, given: Any) -> str:
        return str(given) if given is not None else f"ev-{next(self._ids)}"

    async def _queued(self, event_id: Any, client_event_id: Any, **fields: Any) -> None:
        await self.emit({"type": "session.interaction.queued", "request_id": self.request_id,
                         "event_id": event_id, **({"client_event_id": client_event_id}
                                                  if client_event_id is not None and str(client_event_id) != event_id
                                                  else {}), **fields})

    async def _interaction(self, msg: SessionInteraction) -> None:
        live = self._live()
        parts = interaction_parts(msg, self.host.model.spec, self._eid(None))
        live.events.interaction(parts.event_id, parts.keys, parts.prompt)
        await self._queued(parts.event_id, msg.event_id)

    async def _key_down(self, msg: KeyDown) -> None:
        eid = self._eid(msg.event_id)
        self._live().events.key_down(eid, msg.key)
        await self._queued(eid, None, key=msg.key, down=True)

    async def _key_up(self, msg: KeyUp) -> None:
        eid = self._eid(msg.event_id)
        ends = self._live().events.key_up(eid, msg.key)
        await self._queued(eid, None, key=msg.key, down=False, ends_event_id=ends)

    async def _pause(self, msg: SessionPause) -> None:
        live = self._live()
        live.paused, live.paused_at = True, time.perf_counter()
        live.wake.set()
        self.state.paused()
        await self.emit({"type": "session.paused", "request_id": self.request_id, "event_id": msg.event_id,
                         "next_chunk_index": live.driver.step_index})

    async def _resume(self, msg: SessionResume) -> None:
        live = self._live()
        if live.origin is not None and live.paused_at is not None:
            live.origin += time.perf_counter() - live.paused_at
        live.paused, live.paused_at = False, None
        live.wake.set()
        self.state.resumed()
        await self.emit({"type": "session.resumed", "request_id": self.request_id, "event_id": msg.event_id})

    async def _ping(self, msg: SessionPing) -> None:
        await self.emit({"type": "session.pong", "request_id": self.request_id, "event_id": msg.event_id})

    # -- checkpoints --------------------------------------------------------------------------------
    async def _checkpoint(self, msg: SessionCheckpoint) -> None:
        live = self._live()
        async with live.lock:
            cp = await self.host.run(live.driver.checkpoint)
            index = live.driver.step_index
        await self.emit({"type": "session.checkpointed", "request_id": self.request_id, "event_id": msg.event_id,
                         "checkpoint_id": cp, "next_chunk_index": index})

    async def _rollback(self, msg: SessionRollback) -> None:
        live = self._live()
        async with live.lock:
            await self._with_checkpoint(live.driver.rollback, msg.checkpoint_id, msg.event_id)
            index = live.driver.step_index
        await self.emit({"type": "session.rolled_back", "request_id": self.request_id, "event_id": msg.event_id,
                         "checkpoint_id": msg.checkpoint_id, "next_chunk_index": index})

    async def _release(self, msg: CheckpointRelease) -> None:
        live = self._live()
        async with live.lock:
            await self._with_checkpoint(live.driver.release, msg.checkpoint_id, msg.event_id)
        await self.emit({"type": "checkpoint.released", "request_id": self.request_id, "event_id": msg.event_id,
                         "checkpoint_id": msg.checkpoint_id})

    async def _with_checkpoint(self, fn: Callable[[str], None], cp_id: str, event_id: Any) -> None:
        try:
            await self.host.run(fn, cp_id)
        except KeyError:
            raise WorldProtocolError("unknown_checkpoint", f"no checkpoint {cp_id!r} in this session",
                                     event_id) from None

    def _live(self) -> _Live:
        assert self.live is not None  # check() let the message through
        return self.live

    # -- the stepper --------------------------------------------------------------------------------
    async def _stepper(self, live: _Live, started_at: float) -> None:
        period = live.driver.frames_per_chunk / live.cfg.fps if live.cfg.fps > 0 else 0.0
        failed = False
        try:
            while not live.stopping:
                if live.cfg.num_frames is not None and live.frames >= live.cfg.num_frames:
                    break
                if live.paused:
                    live.wake.clear()
                    await live.wake.wait()
                    continue
                if period and live.origin is not None:  # at most one chunk ahead of real time
                    delay = live.origin + (live.chunks - 1) * period - time.perf_counter()
                    if delay > 0:
                        live.wake.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(live.wake.wait(), delay)
                        continue
                await self._one_chunk(live, period, started_at)
        except Exception as e:  # the step failed: this session ends, the server goes on
            logger.exception("world: step failed")
            failed = True
            await self.emit(error_event("step_failed", f"the step failed: {e!r}", None, self.request_id))
        if not live.stopping:
            await self._end_session(None, stopped=failed)

    async def _one_chunk(self, live: _Live, period: float, started_at: float) -> None:
        async with live.lock:
            index = live.driver.step_index
            boundary = live.events.boundary() if index > 0 else Boundary(0, None, (), (), ())
            frames, enc, step_ms, encode_ms = await self.host.run(_compute, live.driver, live.cfg, boundary, index)
            version = live.driver.prompt_version
        now = time.perf_counter()
        behind_ms = None
        if period:
            if live.origin is None:
                live.origin = now
            behind_ms = max(0.0, now - (live.origin + live.chunks * period)) * 1000
        meta = chunk_metadata(self.request_id or "", live.chunks, index, live.driver.model.spec, boundary, version,
                              enc, step_ms, encode_ms, behind_ms, live.cfg.format)
        if live.chunks == 0:
            meta["timings"]["since_start_ms"] = round((now - started_at) * 1000, 3)
        await self.emit_chunk(meta, enc.payload)
        live.chunks += 1
        live.frames += len(frames)
        if behind_ms is not None and behind_ms > period * 1000:
            if live.behind_reported_at is None or now - live.behind_reported_at >= BEHIND_REPORT_S:
                live.behind_reported_at = now
                await self.emit({"type": "session.behind", "request_id": self.request_id, "behind_ms": round(
                    behind_ms, 3), "generation_chunk_index": index, "fps": live.cfg.fps})
        else:
            live.behind_reported_at = None


def _compute(driver: WorldDriver, cfg: StartConfig, boundary: Boundary,
             index: int) -> tuple[np.ndarray, EncodedChunk, float, float]:
    """One chunk on a worker thread: the step (or the start), then its encoding."""
    t0 = time.perf_counter()
    frames = driver.start(cfg.start) if index == 0 else driver.step(boundary.key, boundary.prompt)
    t1 = time.perf_counter()
    enc = encode_chunk(frames, cfg.format)
    return frames, enc, (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000
