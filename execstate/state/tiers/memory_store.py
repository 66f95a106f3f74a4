"""A DRAM tier of whole blobs: a bounded dict of units in host memory (``UnitStore``; contract in
``store.py``).

The KV offload's DRAM tier (``host_cache.py``) is a slab of fixed-size slots, one KV block each;
units of other sizes (a hibernated world session: ``session/world/hibernation.py``) live here
instead, under the same interface as the disk and Redis tiers. Content-addressed, first writer
wins, bounded by ``capacity_bytes`` (the oldest units dropped by the policy), thread-safe (one
lock). It never fails: there is no I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from execstate.identity.keys import BlockKey
from execstate.state.tiers.stats import TierStats
from execstate.state.tiers.store import UnitIndex, UnitStore


class MemoryStore(UnitStore):
    def __init__(self, capacity_bytes: int, policy: str = "lru", name: str = "dram") -> None:
        self.name = name
        self.index = UnitIndex(capacity_bytes, policy)
        self.stats = TierStats(name, capacity_bytes)
        self._blobs: dict[BlockKey, bytes] = {}
        self._lock = threading.Lock()

    def contains(self, key: BlockKey) -> bool:
        return key in self.index

    def put(self, key: BlockKey, parts: Sequence[bytes | memoryview]) -> bool:
        blob = b"".join(parts)
        with self._lock:
            if key in self.index:
                return False
            if not self.index.fits(len(blob)):
                self.stats.dropped("full")
                return False
            dropped = self.index.add(key, len(blob))
            for k in dropped:
                del self._blobs[k]
            self._blobs[key] = blob
        if dropped:
            self.stats.dropped("full", len(dropped))
        self.stats.written()
        self._update_size()
        return True

    def get(self, key: BlockKey) -> bytes | None:
        with self._lock:
            blob = self._blobs.get(key)
        if blob is not None:
            self.index.touch(key)
        return blob

    def discard(self, key: BlockKey) -> None:
        with self._lock:
            if self.index.remove(key):
                del self._blobs[key]
        self._update_size()

    def _update_size(self) -> None:
        self.stats.set_size(len(self.index), self.index.nbytes)
