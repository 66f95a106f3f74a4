"""The receiver's transfer thread: runs :class:`KVImporter` loads off the engine thread (docs/contracts.md 8).

A :class:`LoadWorker` owns one importer and, for reading, the NIXL agent of its :class:`NixlBulk`:
after construction only the worker thread (``execstate-kv-load``) calls them, so their ZeroMQ
sockets and NIXL handles belong to that thread. The owner (the engine thread) talks to it through
two queues:

- in: :meth:`submit_load`, :meth:`submit_release`, :meth:`set_caps`, :meth:`cancel` (any thread);
- out: :meth:`results` drains, in completion order, :class:`LoadDone` (one per submitted load,
  always, even cancelled or failed), :class:`ReleaseDone` (one per submitted release) and
  :class:`Reclaimed` (a stuck read ended). ``on_result`` (optional) is called from the worker
  thread after each result is queued, e.g. to wake the engine thread.

Loads run one at a time, in submission order. (The thread keeps the engine's priority: measured
with ``execstate bench pd --itl-under-loads``, a niced transfer thread is starved on a busy
decode instance and stretches its interference over a window 5x longer, which hurts the running
streams' p99 ITL more, not less.) A load runs the whole protocol, verification
included (handshake, manifest checks, NIXL read, checksums); the owner only commits. Blocks of a
load are the owner's to reuse once its :class:`LoadDone` arrived, unless it names ``stuck`` reads:
then they stay fenced until a :class:`Reclaimed` arrives for every one of them. While reads are
stuck the worker asks NIXL about them every ``reap_interval_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.errors import ErrorCode
from execstate.transfer.importer import KVImporter, LoadResult
from execstate.transfer.job_thread import JobThread
from execstate.transfer.manifest import Capabilities


@dataclass(frozen=True)
class LoadJob:
    job_id: int
    addr: str
    transfer_id: str
    epoch: int
    keys: Sequence[BlockKey]
    dst: Sequence[BlockId]
    need_routes: bool
    start_block: int


@dataclass(frozen=True)
class LoadDone:
    """``result`` is ``None`` when the load was cancelled before it started (nothing was written)."""

    job_id: int
    result: LoadResult | None
    stuck: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ReleaseDone:
    addr: str
    transfer_id: str
    ok: bool


@dataclass(frozen=True)
class Reclaimed:
    stuck_id: int


@dataclass(frozen=True)
class _Release:
    addr: str
    transfer_id: str


@dataclass(frozen=True)
class _SetCaps:
    caps: Capabilities


Result = LoadDone | ReleaseDone | Reclaimed
_Job = LoadJob | _Release | _SetCaps


class LoadWorker:
    """The PD load thread (module docstring), a :class:`JobThread` with the importer's handler."""

    def __init__(
        self,
        importer: KVImporter,
        bulk: NixlBulk,
        on_result: Callable[[], None] | None = None,
        reap_interval_s: float = 0.1,
    ) -> None:
        self.importer = importer
        self.bulk = bulk
        self.reap_interval_s = reap_interval_s
        self._thread: JobThread[_Job, Result] = JobThread(
            "execstate-kv-load", self._handle,
            skipped=lambda job: LoadDone(job.job_id, None) if isinstance(job, LoadJob) else None,  # only loads cancel
            failed=self._failed, on_result=on_result, tick=self._reap,
            tick_s=lambda: self.reap_interval_s if self.bulk.num_stuck else None, on_close=importer.close)

    @property
    def on_result(self) -> Callable[[], object] | None:
        return self._thread.on_result

    @on_result.setter
    def on_result(self, fn: Callable[[], object] | None) -> None:
        self._thread.on_result = fn

    # -- owner side (any thread) -------------------------------------------------------------------

    def submit_load(self, job: LoadJob) -> None:
        self._thread.submit(job)

    def submit_release(self, addr: str, transfer_id: str) -> None:
        self._thread.submit(_Release(addr, transfer_id))

    def set_caps(self, caps: Capabilities) -> None:
        """New local capabilities (weights update): loads submitted after this handshake with them."""
        self._thread.submit(_SetCaps(caps))

    def cancel(self, job_id: int) -> None:
        """Skip ``job_id`` if it has not started (its ``LoadDone`` then has ``result=None``)."""
        self._thread.cancel(job_id)

    def results(self) -> list[Result]:
        return self._thread.results()

    @property
    def has_results(self) -> bool:
        return self._thread.has_results

    def close(self, timeout: float | None = 30.0) -> None:
        """Finish the job in progress and the queued releases; queued loads are not run (their
        ``LoadDone`` say cancelled); stop the thread."""
        self._thread.close(timeout)

    # -- worker thread ------------------------------------------------------------------------------

    def _handle(self, job: _Job) -> Result | None:
        if isinstance(job, LoadJob):
            return self._load(job)
        if isinstance(job, _Release):
            return ReleaseDone(job.addr, job.transfer_id, self._release(job))
        self.importer.caps = job.caps
        return None

    def _reap(self) -> list[Result]:
        return [Reclaimed(sid) for sid in self.bulk.reap_stuck()]

    @staticmethod
    def _internal(exc: Exception) -> LoadResult:
        return LoadResult(False, 0, None, 0, 0, f"{ErrorCode.INTERNAL.value}: {exc!r}", 0.0,
                          error_code=ErrorCode.INTERNAL)

    def _failed(self, job: _Job, exc: Exception) -> Result | None:
        if isinstance(job, LoadJob):
            return LoadDone(job.job_id, self._internal(exc))
        return ReleaseDone(job.addr, job.transfer_id, False) if isinstance(job, _Release) else None

    def _load(self, job: LoadJob) -> LoadDone:
        if self._thread.stopping:
            return LoadDone(job.job_id, None)
        before = self.bulk.stuck_ids()
        try:
            result = self.importer.load(job.addr, job.transfer_id, job.epoch, job.keys, job.dst, job.need_routes,
                                        start_block=job.start_block)
        except Exception as e:  # a bug or bad arguments: this load fails (its stuck reads still named)
            result = self._internal(e)
        return LoadDone(job.job_id, result, self.bulk.stuck_ids() - before)

    def _release(self, job: _Release) -> bool:
        try:
            return self.importer.release(job.addr, job.transfer_id)
        except Exception:  # best effort: the source's TTL is the fallback
            return False
