"""The interface of an offload tier below DRAM, and the index those tiers share (docs/offload.md).

:class:`UnitStore` is what a backend implements: local files (``disk_store.py``), a Redis server
(``redis_store.py``); an S3-compatible store, a shared filesystem or Mooncake would implement the
same five methods. A store keeps opaque unit blobs (``unit.pack_unit``) under block keys; it does
not interpret them: the reader verifies every unit (``transfer/unit_checks.py``).

Contract (the tests in ``tests/state/test_tier_stores.py`` check it for every backend):

- **Content-addressed and idempotent**: ``put(key, parts)`` stores the unit under ``key``; a key
  already stored keeps its unit (first writer wins), so two writers of one key (threads,
  processes, replicas) are safe, and a reader sees one whole unit or none, never a mix.
- **Bounded**: a store holds at most ``capacity_bytes``; ``put`` drops its oldest units (by the
  policy: ``lru``, least recently written or read first; ``fifo``, least recently written) to
  make room, and never waits for room. A unit larger than the capacity is refused.
- **Never fails a caller**: I/O errors and timeouts are counted (``stats``), logged once per
  outage, and answered as "not stored" (``put`` returns False) or "absent" (``get`` returns
  None); after a failure the store is *unavailable* for ``backoff_s`` (``contains`` says False,
  ``put`` refuses at once), then tried again. No call blocks longer than the store's timeout.
- ``contains(key)`` answers from the local index (no I/O): units this process wrote, read, or
  found at start (disk); units the backend lost meanwhile make a later ``get`` return None.
- Threads: ``contains`` runs on the engine thread, ``put`` on the write-back thread, ``get`` and
  ``discard`` on the reload thread; every method is thread-safe.
- Events: a store built with a ``UnitEvents`` (``unit_events.py``) reports every change of its
  index as it happens (:class:`UnitIndex` does it under its lock), naming a stored unit by the
  record at the head of its blob (``unit.read_record``: the only part of a blob a store reads).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence

from execstate.identity.keys import BlockKey
from execstate.state.tiers.stats import TierStats
from execstate.state.tiers.unit import UnitRecord
from execstate.state.tiers.unit_events import UnitEvents

POLICIES = ("lru", "fifo")
logger = logging.getLogger("execstate.offload")


class UnitIndex:
    """Keys a store holds with their sizes, oldest first (thread-safe).

    ``add`` returns the keys to drop to make room (already removed from the index; the caller
    deletes their data); ``touch`` marks a use (``lru`` only). With ``events``, every change of
    the set of keys is reported as it happens, under the index's lock (``unit_events.py``):
    a key entering as stored in ``medium`` (with the record ``add`` was given), keys leaving
    (dropped for room, removed) as removed."""

    def __init__(self, capacity_bytes: int, policy: str = "lru", events: UnitEvents | None = None,
                 medium: str = "") -> None:
        if policy not in POLICIES:
            raise ValueError(f"offload policy must be one of {POLICIES}, got {policy!r}")
        if capacity_bytes < 0:
            raise ValueError(f"capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.events = events
        self.medium = medium
        self._lock = threading.Lock()
        self._sizes: OrderedDict[BlockKey, int] = OrderedDict()
        self._nbytes = 0

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.capacity_bytes

    def add(self, key: BlockKey, nbytes: int, record: UnitRecord | None = None) -> list[BlockKey]:
        """Index ``key`` (``nbytes``; ``record``: what its events name); returns the oldest keys
        dropped to make room. ``ValueError`` when the unit alone exceeds the capacity (nothing
        changed)."""
        if not self.fits(nbytes):
            raise ValueError(f"a unit of {nbytes} bytes exceeds the tier's {self.capacity_bytes}")
        victims: list[BlockKey] = []
        with self._lock:
            old = self._sizes.pop(key, None)
            if old is not None:
                self._nbytes -= old
            while self._sizes and self._nbytes + nbytes > self.capacity_bytes:
                victim, size = self._sizes.popitem(last=False)
                self._nbytes -= size
                victims.append(victim)
            self._sizes[key] = nbytes
            self._nbytes += nbytes
            if self.events is not None:
                if victims:
                    self.events.units_removed(self.medium, victims)
                if old is None:
                    self.events.unit_stored(self.medium, key, record)
        return victims

    def list_keys(self) -> list[BlockKey]:
        """The indexed keys, oldest first (a snapshot)."""
        with self._lock:
            return list(self._sizes)

    def touch(self, key: BlockKey) -> None:
        if self.policy != "lru":
            return
        with self._lock:
            if key in self._sizes:
                self._sizes.move_to_end(key)

    def remove(self, key: BlockKey) -> bool:
        with self._lock:
            size = self._sizes.pop(key, None)
            if size is None:
                return False
            self._nbytes -= size
            if self.events is not None:
                self.events.units_removed(self.medium, [key])
            return True

    def oldest(self, n: int) -> list[BlockKey]:
        with self._lock:
            return list(self._sizes)[:n]


class Health:
    """Up/down state of one tier: down for ``backoff_s`` after a failure (logged once per outage)."""

    def __init__(self, name: str, stats: TierStats, backoff_s: float) -> None:
        self.name, self.stats, self.backoff_s = name, stats, backoff_s
        self._down_until = 0.0
        self._down = False
        self._lock = threading.Lock()

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def failed(self, why: str) -> None:
        self.stats.error()
        with self._lock:
            self._down_until = time.monotonic() + self.backoff_s
            first = not self._down
            self._down = True
        self.stats.set_available(False)
        if first:
            logger.warning("offload tier %s is unavailable (%s): units are recomputed instead; retrying in %.1f s",
                           self.name, why, self.backoff_s)

    def succeeded(self) -> None:
        with self._lock:
            was_down, self._down = self._down, False
        if was_down:
            self.stats.set_available(True)
            logger.warning("offload tier %s is available again", self.name)


class UnitStore(ABC):
    """A tier below DRAM (module docstring: the contract). ``name`` labels its metrics."""

    name: str
    stats: TierStats

    @abstractmethod
    def contains(self, key: BlockKey) -> bool:
        """Whether the local index holds ``key`` and the store is available (no I/O)."""

    @abstractmethod
    def put(self, key: BlockKey, parts: Sequence[bytes | memoryview]) -> bool:
        """Store the blob ``b"".join(parts)`` under ``key`` unless a unit is already there; True
        when this call wrote it. False when already stored, refused or failed (counted)."""

    @abstractmethod
    def get(self, key: BlockKey) -> bytes | memoryview | None:
        """The blob stored under ``key``; None when absent or the store failed (counted)."""

    @abstractmethod
    def discard(self, key: BlockKey) -> None:
        """Remove ``key``'s unit (it failed verification); absent keys are ignored."""

    def close(self) -> None:  # noqa: B027 - optional for a backend
        """Release connections and handles; the store is not used afterwards."""
