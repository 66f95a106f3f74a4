"""The reload thread: verified asynchronous reloads from the offload tiers into the KV pool.

The engine thread submits a :class:`ReloadJob` (blocks the request's admission allocated, and
what it expects each to be: ``unit_checks.ExpectedUnit``) and keeps stepping; the request waits
in ``WAITING_FOR_REMOTE_KVS``. On the thread ``execstate-offload-load``, per job, in chunks of
``CHUNK`` units, until a unit cannot be had or the job's deadline passed:

1. **fetch**: per unit, the first tier that holds its key (DRAM, then the lower tiers in order)
   gives its record, route bytes and KV bytes (a DRAM slot stays pinned until step 3); the record
   and the route rows are verified (``unit_checks``) before anything else. A unit failing a check
   is discarded from that tier (``failures[kind]``) and the next tier is tried; a tier that is
   down or slow answers "absent" (the tier counts it);
2. **verify**: the KV checksums of the chunk's units are computed in parallel (the hash threads)
   and compared with the records; a mismatching unit is discarded and fetched from the next tier;
3. **copy**: the verified units' KV is copied into their blocks (``KVPool.import_block``).

One :class:`ReloadDone` reports the verified prefix (``num_verified``), its route rows, the tier
each unit came from and every failure. Commit contract (as a PD load's, ``transfer/importer.py``):
blocks ``dst[:num_verified]`` hold verified KV and may be committed under their keys with
``routes``; later blocks are garbage and recomputed. Blocks are the engine's again once the
``ReloadDone`` arrived (nothing writes them afterwards; a cancelled job writes nothing).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from execstate.identity.checksum import checksum
from execstate.identity.keys import BlockKey
from execstate.identity.secret_ring import SecretRing
from execstate.state.kv_pool import KVPool
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.store import UnitStore
from execstate.state.tiers.unit import UnitFormatError, UnitLayout, UnitRecord, unpack_unit
from execstate.transfer.errors import ErrorCode
from execstate.transfer.unit_checks import (
    ExpectedUnit,
    UnitCheckError,
    kv_mismatch,
    verify_record,
    verify_routes,
)

logger = logging.getLogger("execstate.offload")
CHUNK = 32  # units fetched, verified and copied together
Tier = HostCache | UnitStore


@dataclass(frozen=True, slots=True)
class ReloadJob:
    job_id: int
    units: Sequence[ExpectedUnit]
    dst: Sequence[int]
    need_routes: bool
    deadline_s: float  # seconds from the start of the job


@dataclass(frozen=True, slots=True)
class UnitFailure:
    tier: str
    kind: str
    detail: str


@dataclass(frozen=True)
class ReloadDone:
    """``cancelled``: the job never ran (nothing written). ``routes``: int16 rows of the verified
    units (``None`` when nothing verified or routes were not needed)."""

    job_id: int
    num_verified: int
    routes: np.ndarray | None
    seconds: float
    sources: list[str] = field(default_factory=list)  # the tier of each verified unit
    failures: list[UnitFailure] = field(default_factory=list)
    timed_out: bool = False
    cancelled: bool = False


@dataclass(slots=True)
class _Fetched:
    tier: Tier
    key: BlockKey  # the key it was asked for (a DRAM entry's key, whatever its record says)
    record: UnitRecord
    rows: np.ndarray | None
    kv: object  # a buffer: the DRAM slot (pinned) or the blob's KV view
    seconds: float


class _Stop:
    pass


class ReloadWorker:
    def __init__(self, pool: KVPool, host: HostCache | None, stores: Sequence[UnitStore], layout: UnitLayout,
                 n_experts: int | None, ring: SecretRing, on_result: Callable[[], None] | None = None,
                 hash_threads: int = 2) -> None:
        self.pool, self.host, self.stores = pool, host, list(stores)
        self.layout, self.n_experts, self.ring = layout, n_experts, ring
        self.on_result = on_result
        self._hash = ThreadPoolExecutor(hash_threads, thread_name_prefix="execstate-offload-hash") \
            if hash_threads > 1 else None
        self._jobs: queue.SimpleQueue[ReloadJob | _Stop] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[ReloadDone] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._cancelled: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="execstate-offload-load", daemon=True)
        self._thread.start()

    # -- engine side ---------------------------------------------------------------------------------

    def submit(self, job: ReloadJob) -> None:
        self._jobs.put(job)

    def cancel(self, job_id: int) -> None:
        """Skip ``job_id`` if it has not started (its ``ReloadDone`` then says ``cancelled``)."""
        with self._lock:
            self._cancelled.add(job_id)

    def results(self) -> list[ReloadDone]:
        out: list[ReloadDone] = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    @property
    def has_results(self) -> bool:
        return not self._results.empty()

    def close(self, timeout: float | None = 30.0) -> None:
        self._jobs.put(_Stop())
        self._thread.join(timeout)
        if self._hash is not None:
            self._hash.shutdown(wait=True)

    # -- worker thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if isinstance(job, _Stop):
                return
            with self._lock:
                cancelled = job.job_id in self._cancelled
                self._cancelled.discard(job.job_id)
            if cancelled:
                done = ReloadDone(job.job_id, 0, None, 0.0, cancelled=True)
            else:
                try:
                    done = self._reload(job)
                except Exception as e:  # a bug: this reload verifies nothing, the thread lives on
                    logger.exception("offload reload failed")
                    done = ReloadDone(job.job_id, 0, None, 0.0, failures=[UnitFailure("-", "internal", repr(e))])
            self._results.put(done)
            if self.on_result is not None:
                self.on_result()

    def tiers(self) -> list[Tier]:
        return ([self.host] if self.host is not None and self.host.visible else []) + self.stores

    def _reload(self, job: ReloadJob) -> ReloadDone:
        t0 = time.monotonic()
        tiers = self.tiers()
        failures: list[UnitFailure] = []
        sources: list[Tier] = []
        rows: list[np.ndarray] = []
        spent: dict[str, float] = {}
        timed_out = False
        n = len(job.units)
        for start in range(0, n, CHUNK):
            if time.monotonic() - t0 > job.deadline_s:
                timed_out = True
                break
            chunk = list(range(start, min(start + CHUNK, n)))
            got: list[_Fetched] = []
            for i in chunk:  # 1. fetch, records and routes checked
                f = self._fetch(tiers, job.units[i], job.need_routes, failures)
                if f is None:
                    break
                got.append(f)
            copied = 0
            slots: list[_Fetched | None] = list(got)
            try:
                digests = self._digests([f.kv for f in got])  # 2. KV checksums, in parallel
                for j, (f, digest) in enumerate(zip(got, digests, strict=True)):
                    i = chunk[j]
                    err = kv_mismatch(f.record, digest)
                    if err is not None:
                        self._release(f)
                        self._failed(f.tier, job.units[i], err, failures)
                        retry = slots[j] = self._fetch(tiers, job.units[i], job.need_routes, failures, after=f.tier,
                                                       hashed=True)
                        if retry is None:
                            break
                        f = retry
                    t1 = time.monotonic()
                    self.pool.import_block(int(job.dst[i]), f.kv)  # 3. copy the verified unit
                    spent[f.tier.name] = spent.get(f.tier.name, 0.0) + f.seconds + time.monotonic() - t1
                    sources.append(f.tier)
                    if f.rows is not None:
                        rows.append(f.rows)
                    copied += 1
            finally:
                for f in slots:
                    if f is not None:
                        self._release(f)
            if copied < len(chunk):
                break
        if timed_out:
            logger.warning("offload reload passed its %.2f s deadline after %d of %d units; recomputing the rest",
                           job.deadline_s, len(sources), n)
        for tier in tiers:
            count = sum(1 for s in sources if s is tier)
            if count:
                tier.stats.reloaded(count, spent.get(tier.name, 0.0))
        verified = len(sources)
        routes = np.concatenate(rows) if job.need_routes and verified else None
        return ReloadDone(job.job_id, verified, routes, time.monotonic() - t0, [t.name for t in sources], failures,
                          timed_out)

    def _fetch(self, tiers: list[Tier], want: ExpectedUnit, need_routes: bool, failures: list[UnitFailure],
               after: Tier | None = None, hashed: bool = False) -> _Fetched | None:
        """The unit from the first tier (after ``after``) that has it and whose record and routes
        verify; with ``hashed`` its KV checksum too (a retry after a mismatch). None: no tier."""
        if after is not None:
            tiers = tiers[tiers.index(after) + 1 :]
        for tier in tiers:
            t0 = time.monotonic()
            f = self._fetch_one(tier, want, need_routes, failures)
            if f is None:
                continue
            f.seconds = time.monotonic() - t0
            if hashed:
                err = kv_mismatch(f.record, checksum(f.kv))
                if err is not None:
                    self._release(f)
                    self._failed(tier, want, err, failures)
                    continue
            return f
        return None

    def _fetch_one(self, tier: Tier, want: ExpectedUnit, need_routes: bool,
                   failures: list[UnitFailure]) -> _Fetched | None:
        if not tier.contains(want.key):
            return None
        if isinstance(tier, HostCache):
            held = tier.acquire(want.key)
            if held is None:
                return None
            record, routes, kv = held
        else:
            blob = tier.get(want.key)
            if blob is None:
                return None
            try:
                record, routes, kv = unpack_unit(blob)
            except UnitFormatError as e:
                self._failed(tier, want, UnitCheckError("format", ErrorCode.TRUNCATED, str(e)), failures)
                return None
        f = _Fetched(tier, want.key, record, None, kv, 0.0)
        try:
            verify_record(record, want, self.layout, need_routes, self.ring)
            if need_routes:
                f.rows = verify_routes(record, routes, self.n_experts)
            if memoryview(kv).nbytes != self.pool.unit_nbytes():
                raise UnitCheckError("format", ErrorCode.TRUNCATED, "KV bytes of another size than the pool's blocks")
        except UnitCheckError as e:
            self._release(f)
            self._failed(tier, want, e, failures)
            return None
        return f

    def _digests(self, kvs: list) -> list[bytes]:
        if self._hash is None or len(kvs) < 4:
            return [checksum(kv) for kv in kvs]
        return list(self._hash.map(checksum, kvs))

    @staticmethod
    def _release(f: _Fetched) -> None:
        """Unpin a DRAM slot (once); a blob needs nothing."""
        if isinstance(f.tier, HostCache) and f.kv is not None:
            f.tier.unpin(f.key)
        f.kv = None

    @staticmethod
    def _failed(tier: Tier, want: ExpectedUnit, err: UnitCheckError, failures: list[UnitFailure]) -> None:
        tier.stats.failed(err.kind)
        tier.discard(want.key)
        failures.append(UnitFailure(tier.name, err.kind, str(err)))
        logger.warning("offload unit %s from tier %s failed verification (%s): %s; recomputing it",
                       want.key.hex()[:16], tier.name, err.kind, err)
