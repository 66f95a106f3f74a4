"""World-session migration between two ``World``s (in one process, or across processes by any
byte channel)::

    blob = export_world_session(src_world.sessions, sid, secret)   # the session is MIGRATING
    s = import_world_session(dst_world.sessions, blob, secret)      # checked, then created there
    finish_export(src_world.sessions, sid, ok=True)                  # closes it at the source
    rt = migrate_world_session(src_world.sessions, sid, dst_world.sessions)   # all three
    s2 = s.migrate(dst_world)                                        # the offline WorldSession's shorthand

The offer (``session/world/migration_wire.py``) carries the K/V of the block table's chunks, the
carry, the noise generator's state, the prompt and its version, the held key and the control
state (step index, epochs, branch id, the event queue); checkpoints stay behind. The target
checks it against its own model before allocating anything: the same provenance (model, weights
version, dtype, numerics), frame shape and K/V layout (``incompatible`` otherwise), a window in
the model's range, every chunk's size and sha256 (``checksum_mismatch``), the carry's shape and
finiteness, the generator state's size, a known held key, and the pending events validated by
its own event kinds (``invalid``, naming the field). It writes the chunks' K/V into freshly
allocated blocks; the session then continues exactly as it would have at the source (same
frames, bit for bit, for the same events). On any error the source session is OPEN and
unchanged, and the target holds nothing of it (``MigrationError``, a ``SessionEventError``).
The order of the three calls is the runtime's hand-over (``session/runtime/migration.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from execstate.identity.keys import BlockKey
from execstate.identity.secret_ring import SecretRing
from execstate.model.world.window import RollingWindow
from execstate.session.runtime.events import Event, EventQueue, SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.session.runtime.migration import MigrationError, hand_over
from execstate.session.runtime.migration_wire import WireEvents, events_to_wire, queue_from_wire
from execstate.session.world.camera import CameraCommand, command_to_data
from execstate.session.world.events import CAMERA, KEY, PROMPT, HeldKey
from execstate.session.world.migration_wire import (
    FORMAT_VERSION,
    WireChunk,
    WireHeld,
    WorldOffer,
    camera_from_wire,
    camera_to_wire,
    chunk_digest,
    decode_world_offer,
    encode_world_offer,
)
from execstate.session.world.sessions import WorldSessions
from execstate.session.world.state import WorldState
from execstate.state.block_holds import HeldBlocks
from execstate.state.block_pool import NoFreeBlocks


def _wire_data(e: Event) -> object:
    """An applied event's normalised payload back to what a client submits."""
    if e.kind == KEY:
        name, down = e.data
        return {"key": name, "down": down}
    if e.kind == CAMERA and isinstance(e.data, CameraCommand):
        return command_to_data(e.data)
    if e.kind == CAMERA:
        return {"deltas": [list(d) for d in e.data]}
    if e.kind == PROMPT:
        return {"text": e.data}
    return {"keys": list(e.data)}


def export_world_session(sessions: WorldSessions, session_id: str, secret: SecretRing | None = None) -> bytes:
    """The session's offer; the session is MIGRATING (every call but close refused) until
    :func:`finish_export`."""
    with sessions.lock:
        rt = sessions.manager.get(session_id)
        rt.begin_migration()
        try:
            return encode_world_offer(world_offer(sessions, rt), secret)
        except BaseException:
            rt.end_migration()
            raise


def finish_export(sessions: WorldSessions, session_id: str, ok: bool) -> None:
    """``ok``: the target has the session: close it here. Else it serves here again."""
    with sessions.lock:
        rt = sessions.manager.get(session_id)
        rt.end_migration()
        if ok:
            sessions.manager.close(session_id)


def wire_chunk(sessions: WorldSessions, rec: HeldBlocks) -> WireChunk:
    """One chunk's K/V as it travels (module docstring)."""
    store = sessions.store
    slots = _slots(store.block_size, rec.block_ids)
    k = store.kv.k[:, slots].contiguous().numpy().astype("<f4", copy=False).tobytes()
    v = store.kv.v[:, slots].contiguous().numpy().astype("<f4", copy=False).tobytes()
    return WireChunk(k, v, chunk_digest(k, v))


def world_offer(sessions: WorldSessions, rt: SessionRuntime, with_chunks: bool = True) -> WorldOffer:
    """The session's offer (its chunks' K/V included unless ``with_chunks`` is False)."""
    state = rt.state
    assert isinstance(state, WorldState)
    store, spec = sessions.store, sessions.spec
    chunks = [wire_chunk(sessions, rec) for rec in state.table] if with_chunks else []
    events = events_to_wire(rt.events.snapshot(), _wire_data)
    kv = spec.kv
    carry = state.carry.detach().to(torch.float32).contiguous()
    return WorldOffer(
        FORMAT_VERSION, rt.session_id, store.provenance.digest(), list(spec.frame_shape), spec.frames_per_chunk,
        [kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.tokens_per_chunk], state.window.sink_chunks,
        state.window.window_chunks, chunks, state.n_chunks, state.history, carry.numpy().astype("<f4").tobytes(),
        list(carry.shape), state.generator.get_state().numpy().tobytes(), state.prompt.prompt, state.prompt.version,
        None if state.held is None else WireHeld(state.held.key, state.held.event_id), rt.step_index,
        rt.event_epoch, rt.max_event_epoch, rt.branch_id, state.seed, events,
        None if state.camera is None else camera_to_wire(state.camera))


def _slots(block_size: int, block_ids: list) -> torch.Tensor:
    return torch.cat([torch.arange(block_size) + int(b) * block_size for b in block_ids])


def _bad(field: str, why: str) -> MigrationError:
    return MigrationError("invalid", f"world session offer {field}: {why}")


def import_world_session(sessions: WorldSessions, blob: bytes, secret: SecretRing | None = None) -> SessionRuntime:
    """Check the offer against this side's model and create the session (module docstring)."""
    o = decode_world_offer(blob, secret)
    window, carry = check_world_offer(sessions, o)
    queue = offer_queue(sessions, o.events)
    with sessions.lock:
        if o.session_id in {rt.session_id for rt in sessions.manager.resident()}:
            raise MigrationError("conflict", f"session {o.session_id!r} is open here")
        try:
            sid = sessions.manager.admit(o.session_id)
        except SessionEventError as e:
            raise MigrationError(e.code, e.message) from None
        table = write_chunks(sessions, o.chunks)
        state = state_from_offer(sessions, o, window, carry, table)
        rt = SessionRuntime(sid, state, queue, o.branch_id, o.step_index, o.event_epoch, o.max_event_epoch)
        return sessions.manager.add(rt)


def check_world_offer(sessions: WorldSessions, o: WorldOffer) -> tuple[RollingWindow, torch.Tensor]:
    """The offer's window and carry, once it is checked against this side's model (module
    docstring; ``MigrationError``). Its pending events are checked by :func:`offer_queue`."""
    store, spec = sessions.store, sessions.spec
    kv = spec.kv
    if o.provenance_digest != store.provenance.digest():
        raise MigrationError("incompatible", "the session was computed under another provenance (model, weights "
                             "version, dtype or numerics) than this World's")
    if (tuple(o.frame_shape) != spec.frame_shape or o.frames_per_chunk != spec.frames_per_chunk
            or o.kv_layout != [kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.tokens_per_chunk]):
        raise MigrationError("incompatible", "frame shape, frames per chunk or K/V layout differ from this model's")
    try:
        window = sessions.window_for(o.window_chunks, o.sink_chunks)
    except SessionEventError as e:
        raise _bad("window", e.message) from None
    if len(o.chunks) > window.max_chunks or o.n_chunks < len(o.chunks) or (o.n_chunks and not o.chunks):
        raise _bad("chunks", f"{len(o.chunks)} chunks for {o.n_chunks} committed and a window of {window.max_chunks}")
    check_chunks(sessions, o.chunks, "world session offer")
    carry_shape = tuple(sessions.store.model.initial_carry().shape)
    if tuple(o.carry_shape) != carry_shape or len(o.carry) != 4 * int(np.prod(carry_shape)):
        raise _bad("carry", f"must be float32 {list(carry_shape)}")
    carry = torch.from_numpy(np.frombuffer(o.carry, dtype="<f4").astype(np.float32).reshape(carry_shape))
    if not bool(torch.isfinite(carry).all()):
        raise _bad("carry", "holds non-finite values")
    if len(o.rng_state) != torch.Generator().get_state().numel():
        raise _bad("rng_state", f"must be {torch.Generator().get_state().numel()} bytes")
    if o.held is not None and (o.held.key not in spec.keys or o.held.key == "none"):
        raise _bad("held", f"unknown key {o.held.key!r}")
    if o.event_epoch > o.max_event_epoch or o.seed >= 2**63:
        raise _bad("event_epoch", "above max_event_epoch (or seed out of range)")
    if (o.camera is None) != (spec.camera is None):
        raise _bad("camera", "present without a camera rig, or missing with one")
    if o.camera is not None:
        try:
            camera_from_wire(o.camera, spec.frames_per_chunk)
        except ValueError as e:
            raise _bad("camera", str(e)) from None
    return window, carry


def check_chunks(sessions: WorldSessions, chunks: list[WireChunk], what: str) -> None:
    """Every chunk's size and sha256 (``invalid``, ``checksum_mismatch``)."""
    half = sessions.spec.kv.bytes_per_chunk() // 2
    for i, c in enumerate(chunks):
        if len(c.k) != half or len(c.v) != half:
            raise MigrationError("invalid", f"{what} chunks[{i}]: K and V must be {half} bytes each")
        if chunk_digest(c.k, c.v) != c.sha256:
            raise MigrationError("checksum_mismatch", f"{what} chunks[{i}]: sha256 does not match")


def state_from_offer(sessions: WorldSessions, o: WorldOffer, window: RollingWindow, carry: torch.Tensor,
                     table: list[HeldBlocks]) -> WorldState:
    """The session's state from a checked offer, its block table ``table`` (already written)."""
    state = WorldState(sessions.store, window, o.seed, sessions.store.model.encode_prompt(o.prompt, o.prompt_version),
                       carry, BlockKey(bytes(o.history)))
    state.table = table
    state.n_chunks = o.n_chunks
    state.held = None if o.held is None else HeldKey(o.held.key, o.held.event_id)
    state.camera = None if o.camera is None else camera_from_wire(o.camera, sessions.spec.frames_per_chunk)
    state.generator.set_state(torch.frombuffer(bytearray(o.rng_state), dtype=torch.uint8))
    return state


def write_chunks(sessions: WorldSessions, chunks: list[WireChunk]) -> list[HeldBlocks]:
    """Each chunk's K/V written into freshly allocated blocks (held once each); ``capacity``
    (``MigrationError``) when the pool has no room, nothing held then."""
    out: list[HeldBlocks] = []
    try:
        for c in chunks:
            out.append(_write_chunk(sessions, c))
    except NoFreeBlocks:
        for rec in reversed(out):
            sessions.store.holds.release(rec)
        raise MigrationError("capacity", "the K/V pool has no room for the session's chunks") from None
    return out


def _write_chunk(sessions: WorldSessions, c: WireChunk) -> HeldBlocks:
    store, kv = sessions.store, sessions.spec.kv
    rec = store.allocate_chunk()
    shape = (kv.num_layers, kv.tokens_per_chunk, kv.num_kv_heads, kv.head_dim)
    k = torch.from_numpy(np.frombuffer(c.k, dtype="<f4").astype(np.float32).reshape(shape))
    v = torch.from_numpy(np.frombuffer(c.v, dtype="<f4").astype(np.float32).reshape(shape))
    slots = _slots(store.block_size, rec.block_ids)
    for layer in range(kv.num_layers):
        store.kv.write(layer, slots, k[layer], v[layer])
    return rec


def offer_queue(sessions: WorldSessions, ev: WireEvents) -> EventQueue:
    """The event queue of the offer, its pending events validated by this side's kinds."""
    queue = queue_from_wire(ev, sessions.kinds, sessions.max_pending_events, _bad)
    last = ev.last_event_id
    if ev.pending and (last is None or last < ev.pending[-1].event_id):
        raise _bad("events.last_event_id", "below a pending event's id")
    return queue


def migrate_world_session(src: WorldSessions, session_id: str, dst: WorldSessions,
                          secret: SecretRing | None = None) -> SessionRuntime:
    """Move ``session_id`` from ``src`` to ``dst``; the session there. On failure the source
    session serves again, unchanged."""
    _, rt = hand_over(lambda: export_world_session(src, session_id, secret),
                      lambda blob: import_world_session(dst, blob, secret),
                      lambda _, ok: finish_export(src, session_id, ok))
    assert rt.status is SessionStatus.OPEN
    return rt
