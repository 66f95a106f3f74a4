"""Per-tier counters (what ``/metrics`` shows for each offload tier; docs/offload.md "Metrics").

Written from the engine thread (lookups), the write-back thread and the reload thread; every
update takes the stats' own lock, so a :meth:`TierStats.snapshot` is consistent.

- ``units``, ``bytes``: what the tier holds now (set by the tier itself);
- ``hits`` / ``misses``: per request, each full block after the prefix-cache hit that was looked
  up in the tier: found there (hit) or not (miss); the lookup stops at the first block no tier has;
- ``reloaded``: units the reload delivered from this tier, verified;
- ``write_backs``: units written into the tier; ``dropped[reason]``: units it dropped or could not
  take (``full``: the oldest dropped to make room; ``busy``: no slot free of readers and writers;
  ``unavailable``: the tier was down or slow; ``error``: a write failed);
- ``failures[kind]``: units that failed verification on reload (``checksum``, ``record``,
  ``identity``, ``truncated``, ``routes``, ``signature``): each was discarded and recomputed;
- ``errors``: I/O errors (a failed read or write, a timeout) and ``available``: 0 while the tier
  is marked down;
- ``reload_seconds``: histogram of the time one reload spent reading and verifying this tier's
  units (``RELOAD_BUCKETS`` upper bounds, plus ``+Inf``).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

RELOAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class TierSnapshot:
    name: str
    units: int
    bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    reloaded: int
    write_backs: int
    errors: int
    available: bool
    dropped: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    reload_buckets: tuple[int, ...] = ()  # cumulative counts per RELOAD_BUCKETS bound, then +Inf
    reload_sum: float = 0.0

    @property
    def checksum_failures(self) -> int:
        return sum(self.failures.values())


class TierStats:
    def __init__(self, name: str, capacity_bytes: int) -> None:
        self.name = name
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._units = self._bytes = self._hits = self._misses = self._reloaded = 0
        self._write_backs = self._errors = 0
        self._available = True
        self._dropped: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._buckets = [0] * (len(RELOAD_BUCKETS) + 1)
        self._sum = 0.0

    def set_size(self, units: int, nbytes: int) -> None:
        with self._lock:
            self._units, self._bytes = units, nbytes

    def lookup(self, hits: int, misses: int) -> None:
        with self._lock:
            self._hits += hits
            self._misses += misses

    def reloaded(self, units: int, seconds: float) -> None:
        with self._lock:
            self._reloaded += units
            self._buckets[bisect_left(RELOAD_BUCKETS, seconds)] += 1
            self._sum += seconds

    def written(self, units: int = 1) -> None:
        with self._lock:
            self._write_backs += units

    def dropped(self, reason: str, units: int = 1) -> None:
        with self._lock:
            self._dropped[reason] += units

    def failed(self, kind: str) -> None:
        with self._lock:
            self._failures[kind] += 1

    def error(self) -> None:
        with self._lock:
            self._errors += 1

    def set_available(self, up: bool) -> None:
        with self._lock:
            self._available = up

    def snapshot(self) -> TierSnapshot:
        with self._lock:
            cumulative, total = [], 0
            for n in self._buckets:
                total += n
                cumulative.append(total)
            return TierSnapshot(
                self.name, self._units, self._bytes, self.capacity_bytes, self._hits, self._misses, self._reloaded,
                self._write_backs, self._errors, self._available, dict(self._dropped), dict(self._failures),
                tuple(cumulative), self._sum,
            )
