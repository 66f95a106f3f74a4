"""The world-model sessions of one ``World``: the API the offline ``WorldSession`` and
``AsyncWorld`` call (``docs/world-sessions.md``). The generic rules (status machine, step index,
epochs, checkpoints, forks, capacity, eviction, event queue) and the shared operations are the
session runtime's (``session/runtime/``: ``lifecycle.py``, ``events.py``, ``manager.py``,
``sessions.py``); this module adds the world kind: ``open``, ``step`` and its info record.

Thread safety: every call takes the sessions' lock (an ``RLock``: ``KindSessions``' lock), except
the compute phase of a step (``session/world/step.py``), which runs outside it on private
inputs: while one session computes a chunk, any thread may submit events to it (queued for its
next boundary), and other sessions may be used, stepped (in parallel) or closed. A second step of
the same session is refused ``busy``.

Memory: the sessions share one K/V pool of ``num_blocks`` blocks. Each session may hold at most
``session_blocks`` distinct blocks (its table, the chunk being computed, and what its
checkpoints and origin pin); a step beyond that is refused with code ``budget``, and a step
that finds the shared pool full with ``capacity`` (neither changes anything). With the default
sizes (``num_blocks = max_sessions * session_blocks``) the pool never fills.

Errors are :class:`SessionEventError` with a ``code`` (``docs/world-sessions.md``).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from execstate.identity.secret_ring import SecretRing
from execstate.model.world.interface import KVWriter, WorldModel
from execstate.model.world.window import RollingWindow
from execstate.session.runtime.access import LOCAL, Access
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.session.runtime.manager import SessionManager, SessionPolicy
from execstate.session.runtime.sessions import KindSessions, runtime_fields
from execstate.session.world.events import ACTION, held_after, world_event_kinds
from execstate.session.world.state import WorldSaved, WorldState, WorldStore, start_history, step_history
from execstate.session.world.step import (
    WorldStepResult,
    compute_world_step,
    finish_world_step,
    prepare_world_step,
)
from execstate.state.tiers.memory_store import MemoryStore
from execstate.state.tiers.store import UnitStore

HIBERNATE_DRAM_BYTES = 1 << 30  # the default hibernation tier's bound (units are dropped oldest first past it)


@dataclass(frozen=True)
class WorldSessionInfo:
    session_id: str
    status: str
    step_index: int
    event_epoch: int
    branch_id: str
    n_chunks: int  # chunks committed (the start frames included)
    prompt: str
    prompt_version: int
    held_key: str | None
    blocks_in_use: int  # distinct K/V blocks the session holds (checkpoints and origin included)
    budget_blocks: int
    checkpoints: list[str]
    num_checkpoints: int
    last_event_id: int | None
    num_pending_events: int
    stepping: bool
    error: str | None
    state_key: str | None  # hex; None once the session ended
    held_key_after_pending: str | None  # held once the pending events apply (a step in flight's not counted)


class WorldSessions(KindSessions[WorldSessionInfo]):
    """The world kind's sessions object (module docstring); the shared operations (events,
    checkpoints, rollback, fork, reset, close, info) are ``KindSessions``'."""

    def __init__(self, model: WorldModel, max_sessions: int = 8, session_blocks: int | None = None,
                 num_blocks: int | None = None, eviction: str | None = None, max_session_events: int = 64,
                 block_size: int | None = None, policy: SessionPolicy | None = None,
                 hibernate_to: UnitStore | None = None, hibernate_secret: SecretRing | None = None) -> None:
        """``hibernate_to``: the tier hibernated sessions sleep in (``session/world/hibernation.py``;
        None: a DRAM tier of ``HIBERNATE_DRAM_BYTES``); ``hibernate_secret`` signs their units (None:
        a ring of a random key of this object, ``SecretRing.ephemeral()``, so only it can wake them)."""
        spec = model.spec
        block_size = spec.kv.tokens_per_frame if block_size is None else block_size
        bpc = spec.kv.blocks_per_chunk(block_size)
        self.max_chunks = spec.sink_chunks + spec.max_window_chunks
        least = (self.max_chunks + 1) * bpc
        session_blocks = 4 * least if session_blocks is None else session_blocks
        if isinstance(session_blocks, bool) or not isinstance(session_blocks, int) or session_blocks < least:
            raise ValueError(f"session_blocks must be an int >= {least} (the window and one chunk in flight), "
                             f"got {session_blocks!r}")
        super().__init__(SessionManager(max_sessions, eviction, policy),
                         world_event_kinds(spec.keys, spec.frames_per_chunk, spec.camera_dim, spec.camera),
                         max_session_events,
                         threading.RLock())
        num_blocks = max_sessions * session_blocks if num_blocks is None else num_blocks
        self.store = WorldStore(model, num_blocks, block_size)
        self.spec = spec
        self.session_blocks = session_blocks
        self.hibernation_store: UnitStore = (MemoryStore(HIBERNATE_DRAM_BYTES, name="world-dram")
                                             if hibernate_to is None else hibernate_to)
        if hibernate_secret is not None and not isinstance(hibernate_secret, SecretRing):
            raise ValueError(f"hibernate_secret must be a SecretRing, got {type(hibernate_secret).__name__}")
        self.hibernation_secret = SecretRing.ephemeral() if hibernate_secret is None else hibernate_secret

    # -- lifecycle --------------------------------------------------------------------------------
    def open(self, session_id: str | None = None, prompt: str = "", seed: int = 0,
             start_frames: np.ndarray | None = None, window_chunks: int | None = None,
             sink_chunks: int | None = None, access: Access = LOCAL) -> SessionRuntime:
        """A new session of ``access``'s owner (``session/runtime/access.py``). ``start_frames`` (uint8 ``[F, H, W,
        3]``) are committed as its first
        chunk now (its origin then holds them); else its first step generates from the prompt."""
        window = self.window_for(window_chunks, sink_chunks)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise SessionEventError("invalid", f"seed must be an int in [0, 2**63), got {seed!r}")
        try:
            self.kinds["prompt"].validate({"text": prompt})
            digest = None
            if start_frames is not None:
                latents = self.store.model.encode_frames(start_frames)
                digest = hashlib.sha256(np.ascontiguousarray(start_frames).tobytes()).hexdigest()
        except ValueError as exc:
            raise SessionEventError("invalid", str(exc)) from None
        with self.lock:
            sid = self.manager.admit(session_id, access)
            model = self.store.model
            history = start_history(self.store.root, seed, prompt, digest, window.sink_chunks, window.window_chunks)
            state = WorldState(self.store, window, seed, model.encode_prompt(prompt, 0), model.initial_carry(),
                               history)
            if start_frames is not None:
                self._commit_start(state, latents)
            return self.manager.add(SessionRuntime(sid, state, self.new_queue(), secrets.token_hex(8),
                                                   owner=access.owner, holder=access.holder))

    def window_for(self, window_chunks: int | None, sink_chunks: int | None) -> RollingWindow:
        spec = self.spec
        w = spec.max_window_chunks if window_chunks is None else window_chunks
        s = spec.sink_chunks if sink_chunks is None else sink_chunks
        for name, v, lo, hi in (
            ("window_chunks", w, 1, spec.max_window_chunks),
            ("sink_chunks", s, 0, spec.sink_chunks),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise SessionEventError("invalid", f"{name} must be an int in [{lo}, {hi}] (the model's trained "
                                        f"range), got {v!r}")
        return RollingWindow(s, w)

    def _commit_start(self, state: WorldState, latents: Any) -> None:
        model, store = self.store.model, self.store
        keys = [0] * self.spec.frames_per_chunk
        actions = model.make_actions(keys)
        ctx = model.gather_context(store.kv, [])
        if store.pool.num_free < store.blocks_per_chunk:
            raise SessionEventError("capacity", "the shared K/V pool is full")
        chunk = store.allocate_chunk()
        try:
            carry = model.commit(latents, actions, state.prompt, ctx, state.carry,
                                 KVWriter(store.kv, chunk.block_ids, self.spec.kv))
        except BaseException:
            store.holds.release(chunk)
            raise
        state.append_chunk(chunk, carry, step_history(keys, None, state.prompt))

    # -- events and steps -------------------------------------------------------------------------
    def step(self, session_id: str, action: str | list[str] | None = None, access: Access = LOCAL) -> WorldStepResult:
        """One chunk. ``action`` (a key name, or F names): an ``action`` event with the next id first."""
        with self.lock:
            rt = self.manager.get(session_id, access)
            rt.require(SessionStatus.OPEN)
            if action is not None:
                data = {"key": action} if isinstance(action, str) else {"keys": list(action)}
                rt.submit_event(rt.next_event_id(), ACTION, data)
            state = rt.state
            assert isinstance(state, WorldState)
            held = self.blocks_in_use(rt)
            prep = rt.begin_step(lambda drained: prepare_world_step(
                state, drained, rt.step_index + 1, self.session_blocks, held))
        try:
            done = compute_world_step(state, prep)
        except Exception as exc:
            with self.lock:
                self.store.holds.release(prep.chunk)
                rt.end_step(False, f"{type(exc).__name__}: {exc}", self.manager.tick())
            raise SessionEventError("failed", f"step {prep.step_index} of session {session_id!r} failed: "
                                    f"{type(exc).__name__}: {exc}") from exc
        with self.lock:
            if state.released or rt.status is not SessionStatus.STEPPING:
                self.store.holds.release(prep.chunk)
                raise SessionEventError("closed", f"session {session_id!r} ended during its step")
            result = finish_world_step(session_id, state, prep, done, lambda: self.blocks_in_use(rt))
            rt.end_step(True, clock=self.manager.tick())
            return result

    # -- queries ------------------------------------------------------------------------------------
    def blocks_in_use(self, rt: SessionRuntime) -> int:
        """Distinct blocks the session holds: its table, its checkpoints' and its origin's."""
        state = rt.state
        assert isinstance(state, WorldState)
        if state.released:
            return 0
        ids = state.block_ids()
        for cp in [*rt.checkpoints, rt.origin]:
            if not cp.released:
                ids |= cast(WorldSaved, cp.saved).block_ids()
        return len(ids)

    def describe(self, rt: SessionRuntime) -> WorldSessionInfo:
        state = rt.state
        assert isinstance(state, WorldState)
        return WorldSessionInfo(
            **runtime_fields(rt), n_chunks=state.n_chunks, prompt=state.prompt.prompt,
            prompt_version=state.prompt.version, held_key=None if state.held is None else state.held.key,
            blocks_in_use=self.blocks_in_use(rt), budget_blocks=self.session_blocks,
            held_key_after_pending=self._held_after_pending(rt))

    def _held_after_pending(self, rt: SessionRuntime) -> str | None:
        """The key held once ``rt``'s pending events apply (``world_events.held_after``)."""
        state = rt.state
        assert isinstance(state, WorldState)
        pending = (e for entry in rt.events.snapshot().pending for e in entry)
        held = held_after(state.held, pending, self.spec.frames_per_chunk)
        return None if held is None else held.key

    def check_integrity(self) -> None:
        with self.lock:
            self.store.check_integrity()
