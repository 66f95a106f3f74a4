"""The reload thread: verified asynchronous reloads from the offload tiers into the KV pool.

The engine thread submits a :class:`ReloadJob` (blocks the request's admission allocated, and
what it expects each to be: ``unit_checks.ExpectedUnit``) and keeps stepping; the request waits
in ``WAITING_FOR_REMOTE_KVS``. On the thread ``execstate-offload-load``, per job:

1. per unit, in order, until one cannot be had or the job's deadline passed: the first tier that
   holds the key (DRAM, then the lower tiers in order) gives its record, route bytes and KV
   bytes; the record is verified (``unit_checks.verify_record``) before a byte is copied, then the
   KV is copied into the unit's block (``KVPool.import_block``) and its route rows checked. A unit
   that fails a check is discarded from that tier (``failures[kind]``) and the next tier is tried;
   a tier that is down or slow answers "absent" (the tier counts it);
2. the checksums of every copied block are recomputed on the pool's bytes (in parallel on the
   hash executor) and compared with the records; the first mismatch ends the verified prefix;
3. one :class:`ReloadDone` reports the verified prefix (``num_verified``), its route rows, the
   tier each unit came from and every failure.

Commit contract (the same as a PD load, ``transfer/importer.py``): blocks
``dst[:num_verified]`` hold verified KV and may be committed under their keys with ``routes``;
every later block is garbage and is recomputed. Blocks are the engine's again once the
``ReloadDone`` arrived (nothing writes them afterwards; a cancelled job writes nothing).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId
from execstate.state.kv_pool import KVPool
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.store import UnitStore
from execstate.state.tiers.unit import UnitFormatError, UnitLayout, UnitRecord, unpack_unit
from execstate.transfer.checks import block_checksums
from execstate.transfer.errors import ErrorCode
from execstate.transfer.unit_checks import (
    ExpectedUnit,
    UnitCheckError,
    kv_mismatch,
    verify_record,
    verify_routes,
)

logger = logging.getLogger("execstate.offload")


@dataclass(frozen=True, slots=True)
class ReloadJob:
    job_id: int
    units: Sequence[ExpectedUnit]
    dst: Sequence[BlockId]
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


class _Stop:
    pass


class ReloadWorker:
    def __init__(self, pool: KVPool, host: HostCache | None, stores: Sequence[UnitStore], layout: UnitLayout,
                 n_experts: int | None, secret: bytes | None, on_result=None, hash_threads: int = 2) -> None:
        self.pool, self.host, self.stores = pool, host, list(stores)
        self.layout, self.n_experts, self.secret = layout, n_experts, secret
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

    def _tiers(self) -> list[HostCache | UnitStore]:
        return ([self.host] if self.host is not None and self.host.visible else []) + self.stores

    def _reload(self, job: ReloadJob) -> ReloadDone:
        t0 = time.monotonic()
        tiers = self._tiers()
        copied: list[tuple[UnitRecord, HostCache | UnitStore]] = []
        rows: list[np.ndarray] = []
        failures: list[UnitFailure] = []
        per_tier: dict[str, list[float]] = {}
        timed_out = False
        for want, dst in zip(job.units, job.dst, strict=True):
            if time.monotonic() - t0 > job.deadline_s:
                timed_out = True
                break
            got = None
            for tier in tiers:
                t1 = time.monotonic()
                got = self._one(tier, want, int(dst), job.need_routes, failures)
                if got is not None:
                    acc = per_tier.setdefault(tier.name, [0, 0.0])
                    acc[0] += 1
                    acc[1] += time.monotonic() - t1
                    copied.append((got[0], tier))
                    if got[1] is not None:
                        rows.append(got[1])
                    break
            if got is None:
                break
        verified = len(copied)
        if copied:  # step 2: the checksums of the bytes that landed in the pool
            t2 = time.monotonic()
            sums = block_checksums(self.pool, [int(b) for b in job.dst[:verified]], self._hash)
            for j, ((record, tier), landed) in enumerate(zip(copied, sums, strict=True)):
                err = kv_mismatch(record, landed)
                if err is not None:
                    self._failed(tier, record.key, err, failures)
                    verified = j
                    break
            hashed = (time.monotonic() - t2) / len(copied)
            for _, tier in copied:
                per_tier[tier.name][1] += hashed
        if timed_out:
            logger.warning("offload reload passed its %.2f s deadline after %d of %d units; recomputing the rest",
                           job.deadline_s, len(copied), len(job.units))
        for tier in tiers:
            acc = per_tier.get(tier.name)
            if acc is not None:
                tier.stats.reloaded(min(acc[0], verified), acc[1])
        routes = np.concatenate(rows[:verified]) if job.need_routes and verified else None
        return ReloadDone(job.job_id, verified, routes, time.monotonic() - t0,
                          [t.name for _, t in copied[:verified]], failures, timed_out)

    def _one(self, tier: HostCache | UnitStore, want: ExpectedUnit, dst: int, need_routes: bool,
             failures: list[UnitFailure]) -> tuple[UnitRecord, np.ndarray | None] | None:
        """Copy ``want``'s unit from ``tier`` into block ``dst`` after checking its record; its
        route rows. None when the tier does not have it or it failed a check (discarded)."""
        if not tier.contains(want.key):
            return None
        if isinstance(tier, HostCache):
            held = tier.acquire(want.key)
            if held is None:
                return None
            record, routes, kv = held
            try:
                return self._checked_copy(tier, record, routes, kv, want, dst, need_routes, failures)
            finally:
                tier.unpin(want.key)
        blob = tier.get(want.key)
        if blob is None:
            return None
        try:
            record, routes, kv = unpack_unit(blob)
        except UnitFormatError as e:
            self._failed(tier, want.key, UnitCheckError("format", ErrorCode.TRUNCATED, str(e)), failures)
            return None
        return self._checked_copy(tier, record, routes, kv, want, dst, need_routes, failures)

    def _checked_copy(self, tier: HostCache | UnitStore, record: UnitRecord, routes, kv, want: ExpectedUnit,
                      dst: int, need_routes: bool, failures: list[UnitFailure]):
        try:
            verify_record(record, want, self.layout, need_routes, self.secret)
            rows = verify_routes(record, routes, self.n_experts) if need_routes else None
            if memoryview(kv).nbytes != self.pool.unit_nbytes():
                raise UnitCheckError("format", ErrorCode.TRUNCATED, "KV bytes of another size than the pool's blocks")
        except UnitCheckError as e:
            self._failed(tier, want.key, e, failures)
            return None
        self.pool.import_block(dst, kv)
        return record, rows

    def _failed(self, tier: HostCache | UnitStore, key: BlockKey, err: UnitCheckError,
                failures: list[UnitFailure]) -> None:
        tier.stats.failed(err.kind)
        tier.discard(key)
        failures.append(UnitFailure(tier.name, err.kind, str(err)))
        logger.warning("offload unit %s from tier %s failed verification (%s): %s; recomputing it",
                       key.hex()[:16], tier.name, err.kind, err)
