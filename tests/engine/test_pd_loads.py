"""``RemoteLoads`` (the decode side's ExternalPrefix) with a fake transfer thread: failure
policies, limits, fenced blocks bounded and reclaimed. Pure Python: no NIXL, no model."""

from __future__ import annotations

import numpy as np
import pytest

from execstate.engine.external_prefix import ExternalLoadError
from execstate.engine.pd_loads import LoadStats, RemoteLoads
from execstate.engine.request import Request
from execstate.engine.sampling_params import SamplingParams
from execstate.state.block_pool import BlockPool
from execstate.transfer.errors import ErrorCode
from execstate.transfer.handoff import Handoff
from execstate.transfer.importer import LoadResult
from execstate.transfer.load_worker import LoadDone, Reclaimed

ADDR = "tcp://10.0.0.1:5600"


class FakeWorker:
    def __init__(self) -> None:
        self.jobs: list = []
        self.releases: list[tuple[str, str]] = []
        self.cancelled: set[int] = set()
        self._results: list = []

    def submit_load(self, job) -> None:
        self.jobs.append(job)

    def submit_release(self, addr: str, transfer_id: str) -> None:
        self.releases.append((addr, transfer_id))

    def cancel(self, job_id: int) -> None:
        self.cancelled.add(job_id)

    def results(self) -> list:
        out, self._results = self._results, []
        return out

    @property
    def has_results(self) -> bool:
        return bool(self._results)

    def finish(self, job, ok=True, verified=None, stuck=(), error="checksum_mismatch: block 1") -> None:
        n = len(job.dst) if verified is None else verified
        routes = np.zeros((n * 4, 2, 2), np.int16) if n else None
        res = LoadResult(ok, n, routes, 1000, 10, None if ok else error, 0.01,
                         error_code=None if ok else ErrorCode.CHECKSUM_MISMATCH)
        self._results.append(LoadDone(job.job_id, res, frozenset(stuck)))


def make(policy: str = "fail", max_inflight: int = 4, max_fenced: int = 6):
    pool = BlockPool(32)
    worker = FakeWorker()
    loads = RemoteLoads(worker, pool, 4, True, policy, max_inflight, max_fenced, LoadStats())
    return loads, worker, pool


def request(rid: str, n_blocks: int = 3) -> Request:
    r = Request(rid, list(range(n_blocks * 4 + 1)), SamplingParams(max_tokens=2), 256)
    r.transfer.handoff = Handoff("P0", ADDR, f"P0/{rid}", 0, n_blocks, 4, 2**40)
    return r


def start(loads: RemoteLoads, pool: BlockPool, rid: str, n: int = 3) -> tuple[Request, list[int]]:
    req = request(rid, n)
    dst = pool.allocate(n)
    try:
        loads.start_load(req, 0, [bytes(32)] * n, dst)
    except ExternalLoadError:
        pool.free(dst)  # as KVCacheManager.admit does
        raise
    return req, dst


def test_ok_load_and_the_job_sent_to_the_transfer_thread():
    loads, worker, pool = make()
    req, dst = start(loads, pool, "a")
    (job,) = worker.jobs
    assert (job.addr, job.transfer_id, job.epoch, list(job.dst), job.need_routes) == (ADDR, "P0/a", 0, dst, True)
    assert loads.finished_loads() == [] and loads.num_inflight == 1
    worker.finish(job)
    (done,) = loads.finished_loads()
    assert done.request is req and done.load.error is None and done.load.num_verified_blocks == 3
    assert loads.num_inflight == 0 and loads.stats.loads == 1 and loads.stats.kv_bytes == 1000
    assert req.transfer.info == {"kv_bytes": 1000, "control_bytes": 10, "seconds": 0.01}


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_failure_policy(policy):
    loads, worker, pool = make(policy)
    seen = []
    loads.on_transfer = lambda *a: seen.append(a)
    start(loads, pool, "a")
    worker.finish(worker.jobs[0], ok=False, verified=1)
    (done,) = loads.finished_loads()
    if policy == "fail":
        assert done.load.error.startswith(f"KV load from {ADDR} failed: checksum_mismatch")
    else:  # the verified prefix is kept, the rest is computed by the engine
        assert done.load.error is None and done.load.num_verified_blocks == 1 and done.load.routes.shape[0] == 4
    assert loads.stats.failures == 1 and seen == [(1000, False, 10, 0.01)]


def test_inflight_limit_refuses_and_releases_the_source():
    loads, worker, pool = make(max_inflight=2)
    start(loads, pool, "a")
    start(loads, pool, "b")
    with pytest.raises(ExternalLoadError, match="max_inflight_transfers=2"):
        start(loads, pool, "c")
    assert worker.releases == [(ADDR, "P0/c")] and len(worker.jobs) == 2 and loads.stats.refused == 1
    worker.finish(worker.jobs[0])
    loads.finished_loads()
    start(loads, pool, "d")  # room again
    assert len(worker.jobs) == 3


def test_cancel_reaches_the_worker_and_the_result_still_arrives():
    loads, worker, pool = make()
    req, _ = start(loads, pool, "a")
    loads.cancel_load(req)
    assert worker.cancelled == {worker.jobs[0].job_id}
    worker._results.append(LoadDone(worker.jobs[0].job_id, None))  # cancelled before it started
    (done,) = loads.finished_loads()
    assert done.request is req and done.load.error == "KV load cancelled"


def test_skip_load_sends_a_release_without_a_load():
    loads, worker, pool = make()
    loads.skip_load(request("a"))
    assert worker.releases == [(ADDR, "P0/a")] and worker.jobs == [] and loads.stats.released_without_load == 1


def test_stuck_reads_fence_blocks_bounded_and_reclaimed():
    loads, worker, pool = make(policy="recompute", max_fenced=6)
    req_a, dst_a = start(loads, pool, "a")
    req_b, dst_b = start(loads, pool, "b")
    worker.finish(worker.jobs[0], stuck=[7])  # a read NIXL could not cancel
    worker.finish(worker.jobs[1], stuck=[8, 9])
    done = loads.finished_loads()
    assert [d.load.error for d in done] == [
        f"KV load from {ADDR}: a timed-out read could not be cancelled; 3 blocks fenced"] * 2  # whatever the policy
    for dst in (dst_a, dst_b):  # the requests let go of their blocks
        pool.free(list(reversed(dst)))
    assert sorted(loads.fenced_blocks) == sorted(dst_a + dst_b) and pool.num_used == 6
    assert all(pool.ref_count(b) == 1 for b in dst_a + dst_b)  # held by the fence only
    with pytest.raises(ExternalLoadError, match="6 KV blocks fenced.*max_fenced_blocks=6"):
        start(loads, pool, "c")
    assert worker.releases[-1] == (ADDR, "P0/c")
    worker._results.append(Reclaimed(7))
    loads.poll()
    assert sorted(loads.fenced_blocks) == sorted(dst_b) and all(pool.ref_count(b) == 0 for b in dst_a)
    start(loads, pool, "d")  # under the bound again: loads start
    worker._results.append(Reclaimed(8))
    loads.poll()
    assert len(loads.fenced_blocks) == 3  # b waits for both of its stuck reads
    worker._results.append(Reclaimed(9))
    loads.poll()
    assert loads.fenced_blocks == [] and loads.stats.reclaimed_blocks == 6
    assert pool.num_used == 3  # d's blocks only
    pool.check_integrity()
