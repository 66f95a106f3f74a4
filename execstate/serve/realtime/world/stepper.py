"""A world session as one connection drives it (:class:`LiveSession`) and its *stepper*: the task
that streams the session's chunks at the target frame rate (``handlers.py`` owns the rest).

Pacing: chunk 0 at once; chunk ``k >= 1`` is begun no earlier than ``origin + (k - 1) * period``
(``period = F / fps``; ``origin`` = when chunk 0 was delivered, shifted by the time spent paused),
so the stream runs at most one chunk ahead of real time; ``fps: 0`` steps back to back. A chunk
delivered after its slot ``origin + k * period`` is late by ``behind_ms`` (in every chunk's
metadata); late by more than one period, it is reported with ``session.behind`` (at most once a
second while behind).

A step the runtime refuses for the session's K/V budget (``budget``: checkpoints pin chunks) ran
nothing: an ``error`` (``budget``) is sent and the session pauses (``on_budget_pause``) until the
client releases a checkpoint and resumes. Any other failure ends the stepper (``error``
``step_failed``); ``run_stepper`` then returns True.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from execstate.serve.realtime.connection import Emit, EmitBinary
from execstate.serve.realtime.world.convert import StartConfig, chunk_metadata
from execstate.serve.realtime.world.encode import encode_chunk
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.messages import error_event
from execstate.session.runtime.events import SessionEventError

BEHIND_REPORT_S = 1.0
ID_MEMORY = 4096  # client event ids remembered per session (a reused one: event_id_conflict)

logger = logging.getLogger(__name__)


@dataclass
class LiveSession:
    """One running session of a connection: pacing state, and the map between the client's event
    ids (strings, shown in the chunks' event lists) and the runtime's (ints, in arrival order)."""

    session_id: str
    cfg: StartConfig
    start_frames: np.ndarray | None  # chunk 0, sent first (None: the first step generates)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # steps and checkpoint ops: one at a time
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # pause/resume/stop changed
    paused: bool = False
    stopping: bool = False
    chunks: int = 0
    frames: int = 0
    origin: float | None = None
    paused_at: float | None = None
    behind_reported_at: float | None = None
    task: asyncio.Task[None] | None = None
    next_id: int = 0  # the runtime's next event id
    client_ids: dict[int, str] = field(default_factory=dict)  # runtime id -> client id, until completed
    prompts: dict[int, str] = field(default_factory=dict)  # runtime id of a prompt event -> its text
    seen: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=ID_MEMORY))
    held: str | None = None  # the key held once every submitted event applies (after a rollback: the runtime's)
    opened_at: float = field(default_factory=time.perf_counter)
    boundary_at: float | None = None  # when the last step began (the boundary camera events are timed from)

    def frame_at(self, received_at: float, frames_per_chunk: int) -> int:
        """The frame of the next chunk an event received at ``received_at`` applies from: as
        vLLM-Omni maps ``received_at``, ``floor((received_at - last boundary) * fps)``, clamped to the
        chunk (0 with no boundary yet or no frame rate)."""
        if self.boundary_at is None or self.cfg.fps <= 0:
            return 0
        return min(max(int((received_at - self.boundary_at) * self.cfg.fps), 0), frames_per_chunk - 1)

    def named(self, events: dict[str, list[int]]) -> tuple[dict[str, list[str]], str | None]:
        """The step's event lists with client ids, and the prompt it applied (None: unchanged);
        forgets the events that completed."""
        prompt = next((self.prompts[e] for e in reversed(events["started"]) if e in self.prompts), None)
        named = {k: list(dict.fromkeys(self.client_ids.get(e, str(e)) for e in v)) for k, v in events.items()}
        for e in events["completed"]:
            if e not in events["active"]:
                self.client_ids.pop(e, None)
                self.prompts.pop(e, None)
        return named, prompt


async def run_stepper(host: WorldHost, live: LiveSession, emit: Emit, emit_chunk: EmitBinary, started_at: float,
                      on_budget_pause: Callable[[], Awaitable[None]]) -> bool:
    """Stream the session's chunks until it stops (module docstring); True when a step failed."""
    period = host.spec.frames_per_chunk / live.cfg.fps if live.cfg.fps > 0 else 0.0
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
            try:
                await _one_chunk(host, live, emit, emit_chunk, period, started_at)
            except SessionEventError as e:
                if e.code != "budget" or live.stopping:
                    raise
                await emit(error_event("budget", e.message, None, live.session_id))
                if not live.paused:
                    live.paused, live.paused_at = True, time.perf_counter()
                    await on_budget_pause()
    except SessionEventError as e:
        if not live.stopping:
            await emit(error_event("step_failed", f"{e.code}: {e.message}", None, live.session_id))
            return True
    except Exception as e:  # a bug: this session ends, the server goes on
        logger.exception("world: step failed")
        await emit(error_event("step_failed", f"the step failed: {e!r}", None, live.session_id))
        return True
    return False


async def _one_chunk(host: WorldHost, live: LiveSession, emit: Emit, emit_chunk: EmitBinary, period: float,
                     started_at: float) -> None:
    spec = host.spec
    async with live.lock:
        if live.start_frames is not None:  # chunk 0: the scene the session started from
            frames, index, keys, version = live.start_frames, 0, ("none",) * spec.frames_per_chunk, 0
            events: dict[str, list[int]] = {"started": [], "active": [], "completed": []}
            timings = {"step_ms": (time.perf_counter() - started_at) * 1000}
            camera = None if spec.camera is None else ((0.0, 0.0),) * spec.frames_per_chunk
            live.start_frames = None
        else:
            live.boundary_at = time.perf_counter()
            r = await host.step(live.session_id)
            frames, index, keys, version, events, timings = (r.frames, r.step_index, r.keys, r.prompt_version,
                                                             r.events, dict(r.timings))
            camera = r.camera
    t0 = time.perf_counter()
    enc = await asyncio.to_thread(encode_chunk, frames, live.cfg.format)
    timings["encode_ms"] = (time.perf_counter() - t0) * 1000
    named, prompt = live.named(events)
    now = time.perf_counter()
    behind_ms = None
    if period:
        if live.origin is None:
            live.origin = now
        behind_ms = max(0.0, now - (live.origin + live.chunks * period)) * 1000
    if live.chunks == 0:
        timings["since_start_ms"] = (now - started_at) * 1000
    await emit_chunk(chunk_metadata(live.session_id, live.chunks, index, spec, keys, named, prompt, version, enc,
                                    timings, behind_ms, live.cfg.format, camera), enc.payload)
    live.chunks += 1
    live.frames += len(frames)
    if behind_ms is not None and behind_ms > period * 1000:
        if live.behind_reported_at is None or now - live.behind_reported_at >= BEHIND_REPORT_S:
            live.behind_reported_at = now
            await emit({"type": "session.behind", "request_id": live.session_id, "behind_ms": round(behind_ms, 3),
                        "generation_chunk_index": index, "fps": live.cfg.fps})
    else:
        live.behind_reported_at = None
