"""World-session hibernation: a world session sleeps as one unit in a tier and wakes on its next
call (docs/offload.md "Hibernation", docs/world-sessions.md; docs/offload.md). The public API::

    s.hibernate(); s.wake()                                    # offline WorldSession
    await aw.hibernate(sid); await aw.wake(sid)                # AsyncWorld (a served session)
    record = hibernate(world.sessions, sid, access)            # this module
    hibernate_idle(world.sessions)                             # the sweep (policy.hibernate_after_s)

**Hibernate** (an OPEN session of the caller's; idempotent): its state is encoded as one
:class:`WorldHibernation` (``hibernation_wire.py``: every distinct chunk's K/V of its window,
checkpoints and origin, the block tables, carry, noise generator state, prompt, held key, history
key, step index, event epochs, branch, pending events, tenant, session state key), signed with
the ``World``'s hibernation secret, and put in the ``World``'s hibernation tier (a ``UnitStore``
of ``state/tiers/``: DRAM, ``memory_store.py``, by default; local disk, ``disk_store.py``, or any
other backend) under :func:`~execstate.session.world.hibernation_wire.unit_key`. Then every K/V
block the session and its checkpoints pin goes back to the pool: it is HIBERNATED
(``session/runtime/lifecycle.py``), holding no block; it still counts in ``max_sessions`` and its
tenant's quota. A tier that refuses the unit (full, down) leaves it awake (``unavailable``).
What stays in memory is the runtime's record (status, step index, epochs, event queue,
checkpoints' control state) and the small tensors of the state (carry, prompt K/V).

**Wake** (transparent: every call that resolves the session, through the manager's waker, which
the first hibernation installs; or :func:`wake`): the unit is read back and checked before
anything is used: present (``lost``), the bytes written (sha256: ``checksum_mismatch`` for a
truncated or corrupt unit), signed with this ``World``'s secret (``unauthorized``), naming this
session's tenant and id (``desync``), computed under this ``World``'s provenance and layout
(``incompatible``: another model or weights version, numerics), its chunks' sizes and sha256, its
carry, generator state and held key (``invalid``, ``checksum_mismatch``), its session state key
the one its contents give and the session's own (``desync``: a stale step index, event epoch or
branch), its pending events the session's (``desync``). A failed check ends the session
(evicted, the reason given; its state is lost, never served wrong). Then its chunks are written
into fresh blocks (``capacity`` when the pool has no room: it stays asleep), the live state and
the checkpoints get their tables back, the unit is discarded, and it is OPEN: its next frames are
those of a session that never slept, bit for bit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import cast

import msgspec

from execstate.identity.keys import BlockKey
from execstate.identity.session_keys import session_state_key
from execstate.session.runtime.access import LOCAL, Access
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.session.runtime.migration import MigrationError
from execstate.session.world.hibernation_wire import (
    FORMAT_VERSION,
    WorldHibernation,
    decode_hibernation,
    digest,
    encode_hibernation,
    unit_key,
)
from execstate.session.world.migration import (
    check_chunks,
    check_world_offer,
    state_from_offer,
    wire_chunk,
    world_offer,
    write_chunks,
)
from execstate.session.world.migration_wire import WireChunk
from execstate.session.world.sessions import WorldSessions
from execstate.session.world.state import WorldSaved, WorldState
from execstate.state.block_holds import HeldBlocks
from execstate.state.tiers.store import UnitStore


@dataclass(eq=False)
class WorldHibernated:
    """A hibernated world session's record (``SessionRuntime.hibernation``): where its unit is,
    what it must be (sha256 of the blob, session state key), and the checkpoints whose tables it
    holds (live ones in order, then the origin)."""

    session_id: str
    store: UnitStore
    key: BlockKey
    digest: bytes
    state_key: bytes
    nbytes: int
    saved: list[WorldSaved] = field(repr=False)
    released: bool = False

    def release(self) -> None:
        """The session woke or ended: its unit leaves the tier (once)."""
        if not self.released:
            self.released = True
            self.store.discard(self.key)


def hibernate(sessions: WorldSessions, session_id: str, access: Access = LOCAL) -> WorldHibernated:
    """Put the caller's session to sleep (module docstring); its record."""
    with sessions.lock:
        rt = sessions.manager.get(session_id, access, wake=False)
        if rt.status is SessionStatus.HIBERNATED:
            return rt.hibernation
        rt.require(SessionStatus.OPEN)
        state = rt.state
        assert isinstance(state, WorldState)
        saved = [cast(WorldSaved, cp.saved) for cp in [*rt.checkpoints, rt.origin] if not cp.released]
        chunks: list[WireChunk] = []
        index: dict[tuple[int, ...], int] = {}

        def table_of(recs: list[HeldBlocks]) -> list[int]:
            out = []
            for rec in recs:
                ids = tuple(int(b) for b in rec.block_ids)
                if ids not in index:
                    index[ids] = len(chunks)
                    chunks.append(wire_chunk(sessions, rec))
                out.append(index[ids])
            return out

        live = table_of(state.table)
        tables = [table_of(s.table) for s in saved]
        key = bytes(rt.state_key())
        tenant = str(rt.owner.tenant)
        h = WorldHibernation(FORMAT_VERSION, tenant, key, world_offer(sessions, rt, with_chunks=False), chunks, live,
                             tables)
        blob = encode_hibernation(h, sessions.hibernation_secret)
        d = digest(blob)
        ukey = unit_key(tenant, rt.session_id, key, d)
        store = sessions.hibernation_store
        if not store.put(ukey, [blob]) and not store.contains(ukey):
            raise SessionEventError("unavailable", f"session {session_id!r} stays awake: the hibernation tier "
                                    f"{store.name!r} refused its unit of {len(blob)} bytes (full or down)")
        state.drop_kv()
        for s in saved:
            s.drop_table()
        record = WorldHibernated(rt.session_id, store, ukey, d, key, len(blob), saved)
        rt.begin_hibernation(record)
        sessions.manager.set_waker(lambda r: wake_runtime(sessions, r))
        return record


def hibernate_idle(sessions: WorldSessions) -> list[WorldHibernated]:
    """Hibernate every session idle past the policy's ``hibernate_after_s`` (a server's sweep)."""
    out = []
    with sessions.lock:
        for rt in sessions.manager.to_hibernate():
            with contextlib.suppress(SessionEventError):
                out.append(hibernate(sessions, rt.session_id, Access(rt.owner, rt.holder)))
    return out


def wake(sessions: WorldSessions, session_id: str, access: Access = LOCAL) -> SessionRuntime:
    """Wake the caller's session now (a no-op when it is awake)."""
    with sessions.lock:
        return sessions.manager.get(session_id, access)


def wake_runtime(sessions: WorldSessions, rt: SessionRuntime) -> None:
    """The manager's waker (module docstring: read, check, rebuild)."""
    with sessions.lock:
        record = rt.hibernation
        assert isinstance(record, WorldHibernated)
        try:
            h, window, carry = _checked(sessions, rt, record)
        except MigrationError as e:
            why = f"session {rt.session_id!r} could not wake: {e.message}; its state is lost, open a new session"
            sessions.manager.lose(rt, why)
            raise SessionEventError(e.code, why) from None
        try:
            fresh = write_chunks(sessions, h.chunks)
        except MigrationError as e:
            raise SessionEventError(e.code, f"session {rt.session_id!r} stays asleep: {e.message}") from None
        holds = sessions.store.holds
        table = [holds.pin(fresh[i]) for i in h.live]
        for s, t in zip(record.saved, h.saved, strict=True):
            s.adopt_table([holds.pin(fresh[i]) for i in t])
        for rec in reversed(fresh):
            holds.release(rec)
        old = rt.state
        rt.state = state_from_offer(sessions, h.offer, window, carry, table)
        old.release()
        rt.end_hibernation()
        record.release()


def _checked(sessions: WorldSessions, rt: SessionRuntime, record: WorldHibernated) -> tuple:
    """The unit, read back and checked (module docstring), with its window and carry."""
    blob = record.store.get(record.key)
    if blob is None:
        raise MigrationError("lost", f"its unit is no longer in the tier {record.store.name!r}")
    blob = bytes(blob)
    if digest(blob) != record.digest:
        raise MigrationError("checksum_mismatch", f"its unit in the tier {record.store.name!r} is not the one "
                             "written (truncated or corrupted)")
    h = decode_hibernation(blob, sessions.hibernation_secret)
    o = h.offer
    if h.tenant != str(rt.owner.tenant) or o.session_id != rt.session_id:
        raise MigrationError("desync", "its unit names another tenant or session")
    window, carry = check_world_offer(sessions, msgspec.structs.replace(o, chunks=[h.chunks[i] for i in h.live]))
    check_chunks(sessions, h.chunks, "hibernated world session")
    if len(h.saved) != len(record.saved):
        raise MigrationError("desync", f"its unit holds {len(h.saved)} checkpoint tables, the session has "
                             f"{len(record.saved)}")
    own = session_state_key(BlockKey(bytes(o.history)), [], o.step_index, o.event_epoch, o.branch_id)
    if bytes(own) != h.state_key or h.state_key != bytes(rt.state_key()):
        raise MigrationError("desync", "a stale unit: its step index, event epoch, branch or history are not the "
                             "session's (state key)")
    mine = world_offer(sessions, rt, with_chunks=False).events
    if msgspec.msgpack.encode(o.events) != msgspec.msgpack.encode(mine):
        raise MigrationError("desync", "its pending events or acknowledgements are not the session's")
    return h, window, carry
