"""The decode side's asynchronous KV loads: the scheduler's ``ExternalPrefix`` (docs/contracts.md 5, 8).

:class:`RemoteLoads` turns a request's verified :class:`~execstate.transfer.handoff.Handoff` into
a job for the transfer thread (:class:`~execstate.transfer.load_worker.LoadWorker`) and the
worker's results into :class:`FinishedLoad` s, on the engine thread (every method here runs on
it; only the worker's queues are shared).

Failure policy, applied to a finished load: ``fail`` turns any transfer error into a request
error; ``recompute`` keeps the verified prefix and lets the engine compute the rest. A load
whose read NIXL could not cancel fails the request whatever the policy, and its destination
blocks are **fenced**: an extra reference keeps them out of the free pool until the worker
reports that every such read ended (:class:`~execstate.transfer.load_worker.Reclaimed`); then
they return to the pool.

Limits (request-level errors from ``start_load``, after telling the source to release):
at most ``max_inflight`` loads queued or running, and no new load while ``max_fenced_blocks``
or more blocks are fenced (so fenced blocks never exceed that bound plus the blocks of the
loads in flight when it was reached).

Owned loads (:meth:`RemoteLoads.submit_owned`): a load that no request waits for (a session
migrating in, ``session/lm/migration_target.py``). Same worker, limits, stats and fencing; its
outcome goes to the owner's callback on the engine thread, with no failure policy applied (the
owner decides). A fenced load reports ``fenced=True``: its blocks are out of the pool until the
read ends, whatever the owner frees.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from execstate.engine.external_prefix import ExternalLoad, ExternalLoadError, FinishedLoad
from execstate.engine.request import Request
from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId, BlockPool
from execstate.transfer.importer import LoadResult
from execstate.transfer.load_worker import LoadDone, LoadJob, LoadWorker, Reclaimed, ReleaseDone


@dataclass
class LoadStats:
    loads: int = 0  # loads that ran (ok or not)
    failures: int = 0  # loads that failed, refused loads, fenced loads
    kv_bytes: int = 0
    control_bytes: int = 0
    load_seconds: float = 0.0  # total wall time of the loads (on the transfer thread)
    refused: int = 0  # over max_inflight / max_fenced_blocks
    released_without_load: int = 0  # release sent because the local cache had every block
    reclaimed_blocks: int = 0  # fenced blocks returned to the pool


@dataclass
class _InFlight:
    request: Request
    dst: list[BlockId]
    addr: str


@dataclass
class _Owned:
    on_done: Callable[[LoadResult | None, bool], None]
    dst: list[BlockId]
    addr: str


@dataclass
class _Fence:
    stuck: set[int]
    blocks: list[BlockId] = field(default_factory=list)


class RemoteLoads:
    def __init__(
        self,
        worker: LoadWorker,
        block_pool: BlockPool,
        block_size: int,
        need_routes: bool,
        failure_policy: str,
        max_inflight: int,
        max_fenced_blocks: int,
        stats: LoadStats,
    ) -> None:
        if max_inflight < 1 or max_fenced_blocks < 1:
            raise ValueError("max_inflight and max_fenced_blocks must be >= 1")
        self.worker = worker
        self.block_pool = block_pool
        self.block_size = block_size
        self.need_routes = need_routes
        self.failure_policy = failure_policy
        self.max_inflight = max_inflight
        self.max_fenced_blocks = max_fenced_blocks
        self.stats = stats
        # Called after every load with (kv_bytes, ok, control_bytes, seconds): the server's metrics hook.
        self.on_transfer: Callable[[int, bool, int, float], None] | None = None
        self._ids = itertools.count(1)
        self._inflight: dict[int, _InFlight] = {}
        self._owned: dict[int, _Owned] = {}
        self._job_of: dict[str, int] = {}
        self._finished: list[FinishedLoad] = []
        self._fences: list[_Fence] = []

    # -- ExternalPrefix ---------------------------------------------------------------------------

    def num_blocks(self, req: Request) -> int:
        return req.transfer.handoff.num_blocks if req.transfer.handoff is not None else 0

    def start_load(self, req: Request, first_block: int, keys: list[BlockKey], dst: list[BlockId]) -> None:
        h = req.transfer.handoff
        assert h is not None
        if self.num_inflight >= self.max_inflight:
            self._refuse(req, f"{self.num_inflight} KV loads in flight (max_inflight_transfers={self.max_inflight})")
        if self.num_fenced_blocks >= self.max_fenced_blocks:
            self._refuse(req, f"{self.num_fenced_blocks} KV blocks fenced after uncancellable reads "
                              f"(max_fenced_blocks={self.max_fenced_blocks})")
        job_id = next(self._ids)
        self._inflight[job_id] = _InFlight(req, list(dst), h.remote_addr)
        self._job_of[req.request_id] = job_id
        self.worker.submit_load(LoadJob(job_id, h.remote_addr, h.transfer_id, h.epoch, list(keys), list(dst),
                                        self.need_routes, first_block))

    def skip_load(self, req: Request) -> None:
        h = req.transfer.handoff
        assert h is not None
        self.stats.released_without_load += 1
        self.worker.submit_release(h.remote_addr, h.transfer_id)

    def cancel_load(self, req: Request) -> None:
        job_id = self._job_of.get(req.request_id)
        if job_id is not None:
            self.worker.cancel(job_id)

    def submit_owned(self, addr: str, transfer_id: str, epoch: int, keys: list[BlockKey], dst: list[BlockId],
                     need_routes: bool, first_block: int,
                     on_done: Callable[[LoadResult | None, bool], None]) -> int:
        """Start a load no request waits for (module docstring); returns its job id.

        ``on_done(result, fenced)`` runs once, on the engine thread (from :meth:`poll`): ``result``
        None when the load was cancelled before it started, ``fenced`` when a read could not be
        cancelled (the blocks stay fenced here). Raises ``ExternalLoadError`` over a limit (nothing
        started; the source is told to release)."""
        if self.num_inflight >= self.max_inflight:
            self._refuse_owned(addr, transfer_id, f"{self.num_inflight} KV loads in flight "
                                                  f"(max_inflight_transfers={self.max_inflight})")
        if self.num_fenced_blocks >= self.max_fenced_blocks:
            self._refuse_owned(addr, transfer_id, f"{self.num_fenced_blocks} KV blocks fenced after "
                                                  f"uncancellable reads (max_fenced_blocks={self.max_fenced_blocks})")
        job_id = next(self._ids)
        self._owned[job_id] = _Owned(on_done, list(dst), addr)
        self.worker.submit_load(LoadJob(job_id, addr, transfer_id, epoch, list(keys), list(dst), need_routes,
                                        first_block))
        return job_id

    def cancel_owned(self, job_id: int) -> None:
        """Skip the owned load if it has not started (its callback then gets ``None``)."""
        if job_id in self._owned:
            self.worker.cancel(job_id)

    def finished_loads(self) -> list[FinishedLoad]:
        self.poll()
        out, self._finished = self._finished, []
        return out

    # -- housekeeping -----------------------------------------------------------------------------

    def poll(self) -> None:
        """Take the worker's results: finished loads (kept for ``finished_loads``), reclaimed fences."""
        for item in self.worker.results():
            if isinstance(item, LoadDone) and item.job_id in self._owned:
                self._on_owned_done(item)
            elif isinstance(item, LoadDone):
                self._on_done(item)
            elif isinstance(item, Reclaimed):
                self._on_reclaimed(item.stuck_id)
            elif isinstance(item, ReleaseDone):
                pass  # best effort; the source's TTL is the fallback

    @property
    def num_inflight(self) -> int:
        """Loads queued or running: requests' and owned ones."""
        return len(self._inflight) + len(self._owned)

    @property
    def has_finished(self) -> bool:
        return bool(self._finished) or self.worker.has_results

    @property
    def fenced_blocks(self) -> list[BlockId]:
        return [b for f in self._fences for b in f.blocks]

    @property
    def num_fenced_blocks(self) -> int:
        return sum(len(f.blocks) for f in self._fences)

    # -- internals --------------------------------------------------------------------------------

    def _refuse(self, req: Request, why: str) -> None:
        self.stats.refused += 1
        self.stats.failures += 1
        handoff = req.transfer.handoff
        assert handoff is not None
        self.worker.submit_release(handoff.remote_addr, handoff.transfer_id)  # free P's pins now
        raise ExternalLoadError(f"KV load refused: {why}")

    def _refuse_owned(self, addr: str, transfer_id: str, why: str) -> None:
        self.stats.refused += 1
        self.stats.failures += 1
        self.worker.submit_release(addr, transfer_id)
        raise ExternalLoadError(f"KV load refused: {why}")

    def _on_owned_done(self, done: LoadDone) -> None:
        owned = self._owned.pop(done.job_id)
        res = done.result
        if res is not None:
            self.stats.loads += 1
            self.stats.kv_bytes += res.kv_bytes
            self.stats.control_bytes += res.control_bytes
            self.stats.load_seconds += res.elapsed_s
            if not res.ok or done.stuck:
                self.stats.failures += 1
            if self.on_transfer is not None:
                self.on_transfer(res.kv_bytes, res.ok and not done.stuck, res.control_bytes, res.elapsed_s)
        if done.stuck:
            self.block_pool.acquire(owned.dst)  # as for a request's load: out of the pool until the read ends
            self._fences.append(_Fence(set(done.stuck), list(owned.dst)))
        owned.on_done(res, bool(done.stuck))

    def _on_done(self, done: LoadDone) -> None:
        flight = self._inflight.pop(done.job_id)
        req = flight.request
        self._job_of.pop(req.request_id, None)
        res = done.result
        if res is None:
            self._finished.append(FinishedLoad(req, ExternalLoad(0, None, "KV load cancelled")))
            return
        self.stats.loads += 1
        self.stats.kv_bytes += res.kv_bytes
        self.stats.control_bytes += res.control_bytes
        self.stats.load_seconds += res.elapsed_s
        req.transfer.info = {"kv_bytes": res.kv_bytes, "control_bytes": res.control_bytes, "seconds": res.elapsed_s}
        if self.on_transfer is not None:
            self.on_transfer(res.kv_bytes, res.ok and not done.stuck, res.control_bytes, res.elapsed_s)
        if done.stuck:
            # A read NIXL could not cancel may still write into these blocks: an extra reference
            # keeps them from reuse until every such read ended (``Reclaimed``).
            self.block_pool.acquire(flight.dst)
            self._fences.append(_Fence(set(done.stuck), list(flight.dst)))
            self.stats.failures += 1
            msg = (f"KV load from {flight.addr}: a timed-out read could not be cancelled; "
                   f"{len(flight.dst)} blocks fenced")
            self._finished.append(FinishedLoad(req, ExternalLoad(0, None, msg)))
            return
        if res.ok:
            self._finished.append(FinishedLoad(req, ExternalLoad(res.num_blocks_verified, res.routes)))
            return
        self.stats.failures += 1
        if self.failure_policy == "fail":
            load = ExternalLoad(0, None, f"KV load from {flight.addr} failed: {res.error}")
        else:  # recompute: keep the verified prefix, compute the rest here
            load = ExternalLoad(res.num_blocks_verified, res.routes)
        self._finished.append(FinishedLoad(req, load))

    def _on_reclaimed(self, stuck_id: int) -> None:
        for fence in list(self._fences):
            fence.stuck.discard(stuck_id)
            if not fence.stuck:
                self._fences.remove(fence)
                self.block_pool.free(list(reversed(fence.blocks)))
                self.stats.reclaimed_blocks += len(fence.blocks)
