"""The DRAM tier's slab (state/tiers/host_cache.py): entry lifecycle, eviction that never takes a
pinned slot, LRU vs FIFO, and its invariants under random operation sequences."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from execstate.identity.keys import BlockKey
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.unit import FORMAT_VERSION, UnitLayout, UnitRecord

LAYOUT = UnitLayout(1, 2, 1, 2, "float32")


def key(i: int) -> BlockKey:
    return BlockKey(hashlib.sha256(f"k{i}".encode()).digest())


def record(i: int) -> UnitRecord:
    k = key(i)
    return UnitRecord(FORMAT_VERSION, k, k, k, [i], LAYOUT, k, None)


def store(cache: HostCache, i: int) -> int:
    """Write unit ``i`` the way the write-back does; returns its slot."""
    slot = cache.reserve(key(i))
    assert slot is not None
    cache.view(slot)[:] = i
    cache.seal(key(i), record(i), None)
    cache.unpin(key(i))
    return slot


def test_lifecycle_and_reads():
    c = HostCache(2, 16)
    slot = c.reserve(key(1))
    assert not c.contains(key(1))  # invisible until sealed
    assert c.acquire(key(1)) is None
    c.view(slot)[:] = 7
    c.seal(key(1), record(1), b"rr")
    assert c.contains(key(1))
    assert c.reserve(key(1)) is None  # idempotent: one entry per key
    c.unpin(key(1))
    rec, routes, view = c.acquire(key(1))
    assert rec == record(1) and routes == b"rr" and (view == 7).all()
    c.unpin(key(1))
    snap = c.stats.snapshot()
    assert (snap.units, snap.bytes, snap.write_backs) == (1, 16, 1)
    c.check_integrity()


def test_full_cache_drops_its_least_recently_used_unit():
    c = HostCache(2, 8, policy="lru")
    store(c, 1)
    store(c, 2)
    c.acquire(key(1))
    c.unpin(key(1))  # 1 is now the most recent
    store(c, 3)
    assert c.contains(key(1)) and not c.contains(key(2)) and c.contains(key(3))
    assert c.stats.snapshot().dropped == {"full": 1}


def test_fifo_drops_the_oldest_written_whatever_was_read():
    c = HostCache(2, 8, policy="fifo")
    store(c, 1)
    store(c, 2)
    c.acquire(key(1))
    c.unpin(key(1))
    store(c, 3)
    assert not c.contains(key(1)) and c.contains(key(2)) and c.contains(key(3))


def test_pinned_slots_are_never_reused():
    c = HostCache(2, 8)
    store(c, 1)
    s1 = c.acquire(key(1))  # a reader holds unit 1
    slot2 = c.reserve(key(2))  # a writer holds unit 2 (unsealed)
    assert s1 is not None and slot2 is not None
    assert c.reserve(key(3)) is None  # nothing evictable: busy, the caller skips the write-back
    assert c.stats.snapshot().dropped == {"busy": 1}
    c.unpin(key(1))
    assert c.reserve(key(3)) is not None  # now unit 1 can go
    assert not c.contains(key(1))
    c.check_integrity()


def test_discard_while_read_frees_the_slot_after_the_reader():
    c = HostCache(1, 8)
    store(c, 1)
    assert c.acquire(key(1)) is not None
    c.discard(key(1))
    assert not c.contains(key(1)) and c.acquire(key(1)) is None
    assert c.reserve(key(2)) is None  # the reader still pins the slot
    c.unpin(key(1))
    assert c.reserve(key(2)) is not None
    c.check_integrity()


def test_staging_only_cache_frees_each_slot_after_its_write():
    c = HostCache(1, 8, visible=False)
    slot = c.reserve(key(1))
    c.seal(key(1), record(1), None)
    assert not c.contains(key(1)) and c.acquire(key(1)) is None
    assert c.reserve(key(2)) is None  # still being written to the lower tiers
    c.unpin(key(1))
    assert c.reserve(key(2)) == slot
    assert c.stats.snapshot().units == 0 and c.stats.capacity_bytes == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="policy"):
        HostCache(1, 8, policy="mru")
    with pytest.raises(ValueError, match="slot"):
        HostCache(0, 8)
    c = HostCache(1, 8)
    store(c, 1)
    with pytest.raises(ValueError, match="without a pin"):
        c.unpin(key(1))


class HostCacheMachine(RuleBasedStateMachine):
    """Random writes, reads, discards: slots never double-booked, a read always sees the bytes its
    writer put there, the unit count matches the visible entries."""

    def __init__(self) -> None:
        super().__init__()
        self.c = HostCache(3, 4, policy="lru")
        self.writing: dict[int, int] = {}  # unit -> slot reserved, not yet sealed
        self.sealed: set[int] = set()  # sealed by the writer, writer's pin still held
        self.reading: list[int] = []

    @rule(i=st.integers(0, 6))
    def reserve(self, i):
        slot = self.c.reserve(key(i))
        if slot is not None:
            self.c.view(slot)[:] = i
            self.writing[i] = slot

    @rule(data=st.data())
    def seal(self, data):
        if self.writing:
            i = data.draw(st.sampled_from(sorted(self.writing)))
            self.c.seal(key(i), record(i), None)
            del self.writing[i]
            self.sealed.add(i)

    @rule(data=st.data())
    def writer_done(self, data):
        if self.sealed:
            i = data.draw(st.sampled_from(sorted(self.sealed)))
            self.c.unpin(key(i))
            self.sealed.discard(i)

    @rule(i=st.integers(0, 6))
    def read(self, i):
        got = self.c.acquire(key(i))
        if got is not None:
            rec, _, view = got
            assert rec.token_ids == [i] and np.all(view == i)
            self.reading.append(i)

    @rule(data=st.data())
    def read_done(self, data):
        if self.reading:
            i = self.reading.pop(data.draw(st.integers(0, len(self.reading) - 1)))
            self.c.unpin(key(i))

    @rule(i=st.integers(0, 6))
    def discard(self, i):
        self.c.discard(key(i))

    @invariant()
    def consistent(self):
        self.c.check_integrity()


TestHostCacheMachine = HostCacheMachine.TestCase
TestHostCacheMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
