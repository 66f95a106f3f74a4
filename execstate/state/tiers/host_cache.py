"""The DRAM tier: a bounded host buffer of unit slots (docs/offload.md).

A slab of ``num_slots`` slots, each the KV bytes of one unit (``unit_nbytes``), with an entry per
stored key: its slot, its record and route bytes once sealed, and a pin count. Pure bookkeeping
(numpy for the slab; the copies from and to the KV pool are ``KVPool.export_block`` /
``import_block``).

Life of an entry (every method holds the cache's lock; a slot is never handed out twice):

1. ``reserve(key)`` (engine thread, at eviction from the pool): a free slot, else the oldest
   *sealed, unpinned* entry's slot (that unit is dropped: ``full``); none → None (``busy``: the
   write-back is skipped, the pool never waits). The new entry is pinned once and invisible.
   The caller copies the block's KV into ``view(slot)`` and hands it to the write-back thread.
2. ``seal(key, record, routes)`` (write-back thread): the entry becomes visible to lookups.
3. ``unpin(key)``: the writer is done (the lower tiers have their copy). An entry of a cache
   without lookup capacity (``visible=False``: the slab only stages write-backs to lower tiers)
   is freed at its last unpin; so is an entry that was discarded or never sealed.
4. ``acquire(key)`` / ``unpin(key)`` (reload thread): a reader pins a sealed entry while it
   copies the slot into the pool, so the slot is not reused meanwhile; with policy ``lru`` a
   read makes the entry the most recent.
5. ``discard(key)``: drop the entry (it failed verification); freed now or at its last unpin.

Invariants (:meth:`check_integrity`): every slot is free or owned by exactly one entry; pins >= 0;
the stats' unit count is the number of visible entries.

KV events (``events``, medium ``dram``; a cache with ``visible=False`` has none to report): a
``seal`` reports the unit stored (its record), a visible entry dropped (``full``) or discarded
reports it removed, under the cache's lock (``unit_events.py``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from execstate.identity.keys import BlockKey
from execstate.state.kv_events.events import DRAM
from execstate.state.tiers.stats import TierStats
from execstate.state.tiers.store import POLICIES
from execstate.state.tiers.unit import UnitRecord
from execstate.state.tiers.unit_events import UnitEvents


@dataclass(slots=True)
class _Entry:
    slot: int
    record: UnitRecord | None = None
    routes: bytes | None = None
    pins: int = 1
    dead: bool = False


class HostCache:
    def __init__(self, num_slots: int, unit_nbytes: int, policy: str = "lru", visible: bool = True,
                 name: str = "dram", events: UnitEvents | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"offload policy must be one of {POLICIES}, got {policy!r}")
        if num_slots < 1 or unit_nbytes < 1:
            raise ValueError(f"need >= 1 slot of >= 1 byte, got {num_slots} x {unit_nbytes}")
        self.name = name
        self.policy = policy
        self.visible = visible
        self.events = events if visible else None
        self.unit_nbytes = unit_nbytes
        self.slab = np.empty((num_slots, unit_nbytes), dtype=np.uint8)
        self.stats = TierStats(name, num_slots * unit_nbytes if visible else 0)
        self._lock = threading.Lock()
        self._entries: OrderedDict[BlockKey, _Entry] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))
        self._num_sealed = 0

    @property
    def num_slots(self) -> int:
        return self.slab.shape[0]

    @property
    def num_pinned(self) -> int:
        """Entries pinned by a writer or a reader now (0 once every write-back and reload is done)."""
        with self._lock:
            return sum(1 for e in self._entries.values() if e.pins)

    def list_keys(self) -> list[BlockKey]:
        """The keys a lookup finds now (sealed, not discarded; none when not ``visible``)."""
        with self._lock:
            return [k for k, e in self._entries.items() if self.visible and e.record is not None and not e.dead]

    def view(self, slot: int) -> np.ndarray:
        row: np.ndarray = self.slab[slot]
        return row

    def contains(self, key: BlockKey) -> bool:
        with self._lock:
            e = self._entries.get(key)
            return self.visible and e is not None and e.record is not None and not e.dead

    def reserve(self, key: BlockKey) -> int | None:
        """A pinned, invisible slot for ``key``'s bytes; None when ``key`` is here already or no slot
        is free of pins (see the module docstring)."""
        with self._lock:
            if key in self._entries:
                return None
            if not self._free and not self._evict_one():
                self.stats.dropped("busy")
                return None
            slot = self._free.pop()
            self._entries[key] = _Entry(slot)
            return slot

    def seal(self, key: BlockKey, record: UnitRecord, routes: bytes | None) -> None:
        with self._lock:
            e = self._entries[key]
            if e.dead or e.record is not None:
                return
            e.record, e.routes = record, routes
            if self.visible:
                self._num_sealed += 1
                self.stats.written()
                self._update_size()
                if self.events is not None:
                    self.events.unit_stored(DRAM, key, record)

    def acquire(self, key: BlockKey) -> tuple[UnitRecord, bytes | None, np.ndarray] | None:
        """Pin a visible entry for reading: ``(record, route bytes, slot view)``; None if absent."""
        with self._lock:
            e = self._entries.get(key)
            if not self.visible or e is None or e.record is None or e.dead:
                return None
            e.pins += 1
            if self.policy == "lru":
                self._entries.move_to_end(key)
            return e.record, e.routes, self.slab[e.slot]

    def unpin(self, key: BlockKey) -> None:
        with self._lock:
            e = self._entries[key]
            if e.pins <= 0:
                raise ValueError(f"unpin of {key.hex()[:16]} without a pin")
            e.pins -= 1
            if e.pins == 0 and (e.dead or e.record is None or not self.visible):
                self._free_entry(key, e)

    def discard(self, key: BlockKey) -> None:
        with self._lock:
            e = self._entries.get(key)
            if e is None or e.dead:
                return
            if e.record is not None and self.visible:
                self._num_sealed -= 1
                self._update_size()
                if self.events is not None:
                    self.events.units_removed(DRAM, [key])
            e.dead = True
            if e.pins == 0:
                self._free_entry(key, e)

    def check_integrity(self) -> None:
        with self._lock:
            owned = [e.slot for e in self._entries.values()]
            if len(set(owned)) != len(owned) or set(owned) & set(self._free):
                raise AssertionError("every slot is free or owned by exactly one entry")
            if len(owned) + len(self._free) != self.num_slots:
                raise AssertionError(f"slots add up: {len(owned)} owned + {len(self._free)} free != {self.num_slots}")
            if any(e.pins < 0 for e in self._entries.values()):
                raise AssertionError("pins >= 0")
            visible = sum(1 for e in self._entries.values() if e.record is not None and not e.dead)
            if self.visible and visible != self._num_sealed:
                raise AssertionError(f"sealed count {self._num_sealed} != visible entries {visible}")

    # -- internals (lock held) --------------------------------------------------------------------

    def _evict_one(self) -> bool:
        for key, e in self._entries.items():
            if e.pins == 0 and e.record is not None and not e.dead:
                self._num_sealed -= 1
                self._free_entry(key, e)
                self.stats.dropped("full")
                self._update_size()
                if self.events is not None:
                    self.events.units_removed(DRAM, [key])
                return True
        return False

    def _free_entry(self, key: BlockKey, e: _Entry) -> None:
        del self._entries[key]
        self._free.append(e.slot)

    def _update_size(self) -> None:
        self.stats.set_size(self._num_sealed, self._num_sealed * self.unit_nbytes)
