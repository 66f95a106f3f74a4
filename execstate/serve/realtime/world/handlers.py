"""The handlers of ``/v1/realtime/video``: one world session per connection, streamed as chunks.

The framework (``serve/realtime/connection.py``) decodes each frame, checks the phase
(``messages.py``'s ``PHASES``), calls the message's handler here, in arrival order and one at a
time, and turns what a handler raises into an ``error`` event; ``emit`` sends a JSON event,
``emit_binary`` a chunk's ``video.chunk_metadata`` and its binary frame back to back (one writer:
nothing interleaves). The session itself is the runtime's (``host.py``): events are submitted to
it as they arrive and it applies them at the next chunk boundary. Contract:

- Every client message gets an answer carrying its ``event_id``: ``video.start``,
  ``session.interaction.queued`` (also for ``key.down``/``key.up``), ``session.paused``,
  ``session.unpaused``, ``session.checkpointed``, ``session.rolled_back``, ``checkpoint.released``,
  ``session.pong``, ``session.closed``, or an ``error`` with a code (the connection stays open).
- Client event ids (strings) name the events in the chunks' ``started``/``active``/``completed``
  lists; the runtime's own ids (ints, in arrival order) never leave the server.
- After ``video.start`` the session's stepper (``stepper.py``) streams chunks at the
  session's fps; an event that arrives while a step runs applies at the next one.
- Pause takes effect at the next boundary (the step in progress is delivered); the real-time clock
  stops while paused. ``session.close`` lets the step in progress finish, then ``session.closed``.
- Checkpoint, rollback and release run between steps (they wait for the step in progress). The
  key held after a rollback is the runtime's (``WorldSessionInfo.held_key_after_pending``: the
  checkpoint's held key with its pending events applied), not a copy kept here.
- A failed step ends the session: ``error`` (``step_failed``) then ``session.closed``.
- ``close()`` (the socket is gone): the stepper stops after its step, the session is closed.
- Ownership: the session is the connection's tenant's (``host.for_tenant``): it counts against the
  tenant's ``world_sessions`` quota and nothing else can reach it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from execstate.serve.realtime.connection import Handler, Peer
from execstate.serve.realtime.errors import ProtocolError
from execstate.serve.realtime.phases import GONE
from execstate.serve.realtime.world.convert import camera_config, interaction_parts, start_config
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.hosts import WorldHosts, as_hosts
from execstate.serve.realtime.world.messages import (
    CLOSE,
    PAUSE,
    START,
    UNPAUSE,
    CheckpointRelease,
    KeyDown,
    KeyUp,
    SessionCheckpoint,
    SessionClose,
    SessionCreate,
    SessionInteraction,
    SessionPause,
    SessionPing,
    SessionRollback,
    SessionUnpause,
)
from execstate.serve.realtime.world.stepper import LiveSession, run_stepper
from execstate.session.runtime.events import SessionEventError


class WorldHandlers:
    def __init__(self, peer: Peer, hosts: WorldHost | WorldHosts) -> None:
        self.hosts = as_hosts(hosts)
        self.tenant = peer.tenant
        # the running session's world (session.create picks it); every session call asks as the
        # connection's tenant
        self.host = self.hosts.default.for_tenant(peer.tenant)
        self.emit = peer.emit
        self.emit_chunk = peer.emit_binary
        self.state = peer.state
        self.live: LiveSession | None = None
        self._ids = itertools.count()
        self.routes: dict[type, Handler] = {
            SessionCreate: self._create, SessionInteraction: self._interaction, KeyDown: self._key_down,
            KeyUp: self._key_up, SessionPause: self._pause, SessionUnpause: self._unpause,
            SessionCheckpoint: self._checkpoint, SessionRollback: self._rollback, CheckpointRelease: self._release,
            SessionPing: self._ping, SessionClose: self._close,
        }

    @property
    def request_id(self) -> str | None:
        return self.state.values["request_id"]

    async def close(self) -> None:
        """The socket is gone: stop the stepper after its step and close the session."""
        await self._end_session()

    # -- session life -------------------------------------------------------------------------------
    async def _create(self, msg: SessionCreate) -> None:
        self.host = self.hosts.pick(msg.model, msg.event_id).for_tenant(self.tenant)
        spec = self.host.spec
        cfg = start_config(msg, spec, self.host.model_name, self.host.default_fps, self.host.max_frames)
        t0 = time.perf_counter()
        try:
            info, frames = await self.host.open(cfg.prompt, cfg.seed, cfg.start, cfg.window_chunks)
        except SessionEventError as e:
            if e.code == "capacity":  # name the server's option
                raise SessionEventError(e.code, f"{e.message} (this server: --world-max-sessions "
                                        f"{self.host.max_sessions})") from None
            raise
        live = LiveSession(info.session_id, cfg, frames)
        self.live = live
        self.state.move(START, request_id=info.session_id)
        h, w, c = spec.frame_shape
        await self.emit({"type": "video.start", "request_id": info.session_id, "event_id": msg.event_id,
                         "format": cfg.format, "config": {
                             "model": self.host.model_name, "prompt": cfg.prompt, "seed": cfg.seed, "fps": cfg.fps,
                             "width": w, "height": h, "channels": c, "frames_per_chunk": spec.frames_per_chunk,
                             "num_inference_steps": len(spec.schedule), "keys": list(spec.keys[1:]),
                             "start": cfg.start, "num_frames": cfg.num_frames,
                             "window_chunks": cfg.window_chunks or spec.max_window_chunks,
                             "memory_bytes": self.host.session_memory_bytes, "budget_blocks": info.budget_blocks,
                             "weights_version": spec.weights_version, "worlds": self.hosts.names,
                             **camera_config(spec)}})
        live.task = asyncio.create_task(self._stepper(live, t0))

    async def _close(self, msg: SessionClose) -> None:
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
            await self.host.close(live.session_id)
        rid = self.request_id
        self.state.move(CLOSE)
        if self.state.phase is not GONE:
            await self.emit({"type": "session.closed", "request_id": rid, "event_id": event_id, "chunks": live.chunks,
                             "frames": live.frames, "stopped": stopped})

    # -- events -------------------------------------------------------------------------------------
    def _client_id(self, live: LiveSession, given: Any) -> str:
        eid = str(given) if given is not None else f"ev-{next(self._ids)}"
        if eid in live.seen:
            raise ProtocolError("event_id_conflict", f"event id {eid!r} was used before in this session",
                                     given)
        return eid

    async def _submit(self, live: LiveSession, client_id: str, kind: str, data: Any) -> int:
        rid = live.next_id
        await self.host.submit(live.session_id, rid, kind, data)  # refused: nothing was queued
        live.next_id += 1
        live.seen.append(client_id)
        live.client_ids[rid] = client_id
        return rid

    async def _queued(self, event_id: str, client_event_id: Any, **fields: Any) -> None:
        extra = {"client_event_id": client_event_id} if client_event_id is not None and str(
            client_event_id) != event_id else {}
        await self.emit({"type": "session.interaction.queued", "request_id": self.request_id, "event_id": event_id,
                         **extra, **fields})

    async def _interaction(self, msg: SessionInteraction) -> None:
        live = self._live()
        parts = interaction_parts(msg, self.host.spec, f"ev-{next(self._ids)}")
        eid = self._client_id(live, parts.event_id)
        events: list[dict[str, Any]] = []
        held = live.held
        if parts.keys is not None:
            if len(parts.keys) > 1:
                raise ProtocolError("unsupported_interaction_schema", "this world holds one key at a time; an "
                                         f"action lists at most one key, got {parts.keys}", eid)
            if parts.keys:
                events.append({"kind": "key", "data": {"key": parts.keys[0], "down": True}})
                held = parts.keys[0]
            elif held is not None:
                events.append({"kind": "key", "data": {"key": held, "down": False}})
                held = None
        if parts.prompt is not None:
            events.append({"kind": "prompt", "data": {"text": parts.prompt}})
        received = None
        if parts.camera is not None:
            received = time.perf_counter()
            at = live.frame_at(received, self.host.spec.frames_per_chunk)
            events.append({"kind": "camera", "data": {**parts.camera, "at_frame": at}})
        if not events:
            raise ProtocolError("invalid_message", "the interaction changes nothing (no key is held)", eid)
        if len(events) == 1:
            rid = await self._submit(live, eid, events[0]["kind"], events[0]["data"])
        else:
            rid = await self._submit(live, eid, "composite", {"events": events})
        if parts.prompt is not None:
            live.prompts[rid] = parts.prompt
        live.held = held
        extra = {} if received is None else {"received_at": round(received - live.opened_at, 6), "at_frame": at}
        await self._queued(eid, msg.event_id, **extra)

    async def _key_down(self, msg: KeyDown) -> None:
        live = self._live()
        eid = self._client_id(live, msg.event_id)
        await self._submit(live, eid, "key", {"key": msg.key, "down": True})
        live.held = msg.key
        await self._queued(eid, None, key=msg.key, down=True)

    async def _key_up(self, msg: KeyUp) -> None:
        live = self._live()
        eid = self._client_id(live, msg.event_id)
        if live.held != msg.key:
            raise ProtocolError("key_not_held", f"key.up for {msg.key!r}, which is not held (held: "
                                     f"{live.held!r}; a key.down of another key releases the one held)", msg.event_id)
        await self._submit(live, eid, "key", {"key": msg.key, "down": False})
        live.held = None
        await self._queued(eid, None, key=msg.key, down=False)

    async def _pause(self, msg: SessionPause) -> None:
        live = self._live()
        live.paused, live.paused_at = True, time.perf_counter()
        live.wake.set()
        self.state.move(PAUSE)
        await self.emit({"type": "session.paused", "request_id": self.request_id, "event_id": msg.event_id})

    async def _unpause(self, msg: SessionUnpause) -> None:
        live = self._live()
        if live.origin is not None and live.paused_at is not None:
            live.origin += time.perf_counter() - live.paused_at
        live.paused, live.paused_at = False, None
        live.wake.set()
        self.state.move(UNPAUSE)
        await self.emit({"type": "session.unpaused", "request_id": self.request_id, "event_id": msg.event_id})

    async def _ping(self, msg: SessionPing) -> None:
        await self.emit({"type": "session.pong", "request_id": self.request_id, "event_id": msg.event_id})

    # -- checkpoints --------------------------------------------------------------------------------
    async def _checkpoint(self, msg: SessionCheckpoint) -> None:
        live = self._live()
        async with live.lock:
            cp = await self.host.checkpoint(live.session_id)
            info = await self.host.info(live.session_id)
        await self.emit({"type": "session.checkpointed", "request_id": self.request_id, "event_id": msg.event_id,
                         "checkpoint_id": cp, "step_index": info.step_index, "blocks_in_use": info.blocks_in_use})

    async def _rollback(self, msg: SessionRollback) -> None:
        live = self._live()
        async with live.lock:
            info = await self.host.rollback(live.session_id, msg.checkpoint_id)
        live.held = info.held_key_after_pending
        await self.emit({"type": "session.rolled_back", "request_id": self.request_id, "event_id": msg.event_id,
                         "checkpoint_id": msg.checkpoint_id, "step_index": info.step_index})

    async def _release(self, msg: CheckpointRelease) -> None:
        live = self._live()
        async with live.lock:
            await self.host.release(live.session_id, msg.checkpoint_id)
        await self.emit({"type": "checkpoint.released", "request_id": self.request_id, "event_id": msg.event_id,
                         "checkpoint_id": msg.checkpoint_id})

    def _live(self) -> LiveSession:
        assert self.live is not None  # the phase check let the message through
        return self.live

    # -- the stepper --------------------------------------------------------------------------------
    async def _stepper(self, live: LiveSession, started_at: float) -> None:
        failed = await run_stepper(self.host, live, self.emit, self.emit_chunk, started_at, self._budget_paused)
        if not live.stopping:
            await self._end_session(None, stopped=failed)

    async def _budget_paused(self) -> None:
        """The stepper paused the session (the next step would exceed its K/V budget)."""
        self.state.move(PAUSE)
        await self.emit({"type": "session.paused", "request_id": self.request_id, "event_id": None,
                         "reason": "budget"})
