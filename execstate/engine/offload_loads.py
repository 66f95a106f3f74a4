"""Reloads from the offload tiers as the scheduler's ``ExternalPrefix`` (docs/offload.md "Reload").

The scheduler consults this source for every request that carries no PD handoff
(``Scheduler.offload``); ``KVCacheManager.admit`` takes the prefix-cache hit first, then asks
:meth:`OffloadLoads.num_blocks`: how far the prompt's full blocks continue in the tiers. When they
do, admission allocates the whole prompt and :meth:`start_load` submits the reload to the reload
thread (``transfer/offload_loader.py``); the request waits in ``WAITING_FOR_REMOTE_KVS`` while
the engine steps the others. Its :class:`FinishedLoad` commits the verified prefix
(``KVCacheManager.apply_external``: those tokens count as ``offloaded`` in
``prompt_token_sources``, their routes are the units' rows); the rest of the prompt is computed.
A reload never fails a request: anything not verified is recomputed (``error`` is always None).

Engine thread only (the reload thread's queues are the only shared state). Requests that force
routes (replayed mode) are never served from a tier.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence

from execstate.engine.external_prefix import ExternalLoad, FinishedLoad
from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.request import Request
from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.store import UnitStore
from execstate.transfer.offload_loader import ReloadDone, ReloadJob, ReloadWorker
from execstate.transfer.unit_checks import ExpectedUnit


class OffloadLoads:
    def __init__(self, kv: KVCacheManager, tiers: Callable[[], Sequence[HostCache | UnitStore]],
                 worker: ReloadWorker, need_routes: bool, timeout_s: float) -> None:
        self.kv = kv
        self.tiers = tiers
        self.worker = worker
        self.need_routes = need_routes
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._inflight: dict[int, Request] = {}
        self._job_of: dict[str, int] = {}
        self._counted: weakref.WeakSet[Request] = weakref.WeakSet()
        self.last_done: ReloadDone | None = None  # the newest reload's report (benchmarks, tests)

    # -- ExternalPrefix ---------------------------------------------------------------------------

    def num_blocks(self, req: Request) -> int:
        """Leading full blocks the pool and the tiers hold together, when the tiers add any after
        the pool's run (else 0: nothing to reload). Counts the tiers' hits and misses once per
        request."""
        if req.params.routed_experts is not None or req.transfer.handoff is not None:
            return 0
        keys = req.cache.block_keys
        limit = min(len(keys), req.num_tokens // self.kv.block_size)
        i = 0
        while i < limit and self._pool_hit(keys[i]):
            i += 1
        tiers = list(self.tiers())
        hits = [0] * len(tiers)
        misses = [0] * len(tiers)
        j = i
        while j < limit:
            holder = next((n for n, t in enumerate(tiers) if t.contains(keys[j])), None)
            for n in range(len(tiers) if holder is None else holder):
                misses[n] += 1
            if holder is None:
                break
            hits[holder] += 1
            j += 1
        if req not in self._counted and i < limit:
            self._counted.add(req)
            for t, h, m in zip(tiers, hits, misses, strict=True):
                t.stats.lookup(h, m)
        return j if j > i else 0

    def start_load(self, req: Request, first_block: int, keys: list[BlockKey], dst: list[BlockId]) -> None:
        bs = self.kv.block_size
        root = self.kv.identity_of(req).root
        tokens = req.all_token_ids
        units = []
        for j, key in enumerate(keys):
            b = first_block + j
            parent = req.cache.block_keys[b - 1] if b else root
            units.append(ExpectedUnit(key, parent, root, tuple(tokens[b * bs : (b + 1) * bs])))
        job_id = next(self._ids)
        self._inflight[job_id] = req
        self._job_of[req.request_id] = job_id
        self.worker.submit(ReloadJob(job_id, units, list(dst), self.need_routes, self.timeout_s))

    def skip_load(self, req: Request) -> None:
        """Nothing to release: the tiers hold no pins for a request."""

    def cancel_load(self, req: Request) -> None:
        job_id = self._job_of.get(req.request_id)
        if job_id is not None:
            self.worker.cancel(job_id)

    def finished_loads(self) -> list[FinishedLoad]:
        out = []
        for done in self.worker.results():
            req = self._inflight.pop(done.job_id)
            self._job_of.pop(req.request_id, None)
            self.last_done = done
            out.append(FinishedLoad(req, ExternalLoad(done.num_verified, done.routes, offloaded=True)))
        return out

    @property
    def has_finished(self) -> bool:
        return self.worker.has_results

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    def _pool_hit(self, key: BlockKey) -> bool:
        """The rule of ``KVCacheManager.find_cached_prefix``: in the pool, with its route record
        when routes are returned."""
        if self.kv.pool.lookup(key) is None:
            return False
        return self.kv.route_store is None or self.kv.route_store.has(key)
