"""Asynchronous PD loads in the scheduler, driven without a model or a network.

``FakeRemote`` is an ``ExternalPrefix`` whose loads finish only when the test says so, with
route rows of its own (each row's expert pair swapped) so every token range's source is visible.
"""

from __future__ import annotations

import numpy as np
from test_scheduler_kv import BS, fake_rows, make, new_req, run_step

from execstate.engine.external_prefix import ExternalLoad, ExternalLoadError, FinishedLoad
from execstate.engine.request import Request, RequestStatus
from execstate.engine.scheduler import SchedulerOutput

LOADING = RequestStatus.WAITING_FOR_REMOTE_KVS


def source_rows(tokens: list[int]) -> np.ndarray:
    """The remote instance's records: valid rows, distinct from ours (top-2 order swapped)."""
    return fake_rows(tokens, 0)[..., ::-1].copy()


class FakeRemote:
    def __init__(self) -> None:
        self.offer: dict[str, int] = {}
        self.started: dict[str, tuple[Request, int, list, list]] = {}
        self.skipped: list[str] = []
        self.cancelled: list[str] = []
        self.refuse: str | None = None
        self._done: list[FinishedLoad] = []

    def num_blocks(self, req: Request) -> int:
        return self.offer.get(req.request_id, 0)

    def start_load(self, req, first_block, keys, dst) -> None:
        if self.refuse is not None:
            raise ExternalLoadError(self.refuse)
        assert len(keys) == len(dst) and req.request_id not in self.started
        self.started[req.request_id] = (req, first_block, list(keys), list(dst))

    def skip_load(self, req: Request) -> None:
        self.skipped.append(req.request_id)

    def cancel_load(self, req: Request) -> None:
        self.cancelled.append(req.request_id)

    def finished_loads(self) -> list[FinishedLoad]:
        out, self._done = self._done, []
        return out

    def complete(self, rid: str, verified: int | None = None, error: str | None = None) -> None:
        req, first, keys, dst = self.started.pop(rid)
        n = len(dst) if verified is None else verified
        toks = req.all_token_ids[first * BS : (first + n) * BS]
        routes = source_rows(toks) if n else None
        self._done.append(FinishedLoad(req, ExternalLoad(n, routes, error)))


def setup(num_blocks: int = 32, **kw):
    sched, pool, store = make(num_blocks=num_blocks, **kw)
    remote = FakeRemote()
    sched.external = remote
    return sched, pool, store, remote


def scheduled_ids(sched) -> tuple[list[str], list]:
    """One step like ``run_step``; returns the ids scheduled and the failed requests."""
    out = sched.schedule()
    ids = [s.request.request_id for s in out.scheduled]
    for s in out.scheduled:
        req = s.request
        toks = req.all_token_ids[s.num_computed_before : s.num_computed_before + s.num_new_tokens]
        req.routes.fill(s.num_computed_before, fake_rows(toks, s.num_computed_before))
        sched.on_computed(s)
        if s.samples:
            req.output_token_ids.append(7)
            if len(req.output_token_ids) >= req.max_new_tokens:
                sched.finish(req, RequestStatus.FINISHED_LENGTH)
    return ids, out.failed


def test_others_keep_running_while_a_load_is_in_flight():
    sched, pool, store, remote = setup()
    r = new_req("r", list(range(100, 106)), max_tokens=20)
    sched.add(r)
    run_step(sched)
    pd = new_req("pd", list(range(14)), max_tokens=3)  # 3 full blocks + 2 tokens
    remote.offer["pd"] = 3
    sched.add(pd)
    for i in range(5):  # the load takes 5 steps: the running stream is served every step
        ids, failed = scheduled_ids(sched)
        assert ids == ["r"] and not failed
        assert pd.status is LOADING and sched.num_loading == 1 and sched.has_unfinished
        assert len(r.output_token_ids) == 2 + i
    _, first, keys, dst = remote.started["pd"]
    assert first == 0 and keys == pd.cache.block_keys[:3] and dst == pd.block_ids[:3]
    assert len(pd.block_ids) == 4  # the whole prompt is held while loading
    remote.complete("pd")
    ids, _ = scheduled_ids(sched)
    assert ids == ["r", "pd"] and pd.status is RequestStatus.RUNNING
    assert pd.num_transferred_tokens == 12 and pd.num_cached_tokens == 0 and sched.num_loading == 0
    # routes: loaded range = the source's records, the tail = our own capture
    np.testing.assert_array_equal(pd.routes.rows(0, 12), source_rows(list(range(12))))
    np.testing.assert_array_equal(pd.routes.rows(12, 14), fake_rows([12, 13], 12))
    for _ in range(30):
        scheduled_ids(sched)
        if not sched.has_unfinished:
            break
    assert pool.num_used == 0
    pool.check_integrity()
    store.check_integrity()


def test_local_hit_then_load_then_compute_routes_from_their_sources():
    sched, pool, store, remote = setup()
    ids = list(range(40, 58))  # 4 full blocks + 2
    local = new_req("local", ids[:8] + [5])
    sched.add(local)
    for _ in range(10):
        run_step(sched)
    pd = new_req("pd", ids)
    remote.offer["pd"] = 4
    sched.add(pd)
    scheduled_ids(sched)
    _, first, keys, dst = remote.started["pd"]
    assert first == 2 and keys == pd.cache.block_keys[2:4] and dst == pd.block_ids[2:4]
    assert pd.num_cached_tokens == 8
    remote.complete("pd")
    scheduled_ids(sched)
    np.testing.assert_array_equal(pd.routes.rows(0, 8), fake_rows(ids[:8], 0))  # our records, not the source's
    np.testing.assert_array_equal(pd.routes.rows(8, 16), source_rows(ids[8:16]))
    np.testing.assert_array_equal(pd.routes.rows(16, 18), fake_rows(ids[16:18], 16))
    assert (pd.num_cached_tokens, pd.num_transferred_tokens) == (8, 8)


def test_local_cache_covering_the_handoff_releases_the_source_without_a_load():
    sched, pool, store, remote = setup()
    ids = list(range(60, 73))  # 3 full blocks + 1
    sched.add(new_req("local", ids))
    for _ in range(10):
        run_step(sched)
    pd = new_req("pd", ids)
    remote.offer["pd"] = 3
    sched.add(pd)
    ids_run, _ = scheduled_ids(sched)
    assert ids_run == ["pd"] and remote.skipped == ["pd"] and remote.started == {}
    assert pd.num_cached_tokens == 12 and pd.num_transferred_tokens == 0


def test_loaded_blocks_are_committed_before_the_first_step():
    sched, pool, store, remote = setup()
    pd = new_req("pd", list(range(200, 213)))
    remote.offer["pd"] = 3
    sched.add(pd)
    sched.schedule()
    remote.complete("pd")
    sched._apply_finished_loads(SchedulerOutput())  # what schedule() does first
    assert all(pool.lookup(k) is not None and store.has(k) for k in pd.cache.block_keys[:3])
    # a preemption right away does not lose them, and the request never loads twice
    sched.running.remove(pd)
    sched._preempt(pd)
    ids, _ = scheduled_ids(sched)
    assert ids == ["pd"] and pd.num_cached_tokens == 0 and pd.num_computed_tokens == 13
    assert remote.started == {} and remote.skipped == []


def test_abort_while_loading_keeps_blocks_until_the_transfer_ended():
    sched, pool, store, remote = setup()
    pd = new_req("pd", list(range(300, 317)))
    remote.offer["pd"] = 4
    sched.add(pd)
    sched.schedule()
    held = list(pd.block_ids)
    assert sched.abort("pd") is pd
    assert pd.status is RequestStatus.FINISHED_ABORTED and remote.cancelled == ["pd"]
    assert sched.abort("pd") is None  # finished once
    for _ in range(3):  # the transfer may still write them: nobody else may get them
        assert sched.schedule().empty
        assert all(pool.ref_count(b) == 1 for b in held)
    remote.complete("pd")
    sched.schedule()
    assert pool.num_used == 0 and sched.num_loading == 0 and not sched.has_unfinished
    pool.check_integrity()
    store.check_integrity()


def test_failed_load_is_a_request_error_and_frees_everything():
    sched, pool, store, remote = setup()
    other = new_req("other", list(range(500, 503)), max_tokens=10)
    sched.add(other)
    pd = new_req("pd", list(range(400, 413)))
    remote.offer["pd"] = 3
    sched.add(pd)
    scheduled_ids(sched)
    remote.complete("pd", verified=1, error="KV load from tcp://p:1 failed: checksum_mismatch: block 1")
    ids, failed = scheduled_ids(sched)
    assert failed == [pd] and ids == ["other"]
    assert pd.status is RequestStatus.FINISHED_ABORTED and "checksum_mismatch" in pd.abort_message
    assert pd.block_ids == [] and all(pool.lookup(k) is None for k in pd.cache.block_keys)  # nothing committed
    assert all(store.lease_count(k) == 0 for k in pd.cache.block_keys)


def test_partial_load_recomputes_the_rest_with_our_routes():
    """What policy ``recompute`` hands the scheduler: a verified prefix, no error."""
    sched, pool, store, remote = setup()
    ids = list(range(600, 617))
    pd = new_req("pd", ids)
    remote.offer["pd"] = 4
    sched.add(pd)
    sched.schedule()
    remote.complete("pd", verified=1)
    out = sched.schedule()
    assert [(s.num_computed_before, s.num_new_tokens) for s in out.scheduled] == [(4, 13)]
    s = out.scheduled[0]
    pd.routes.fill(4, fake_rows(ids[4:17], 4))
    sched.on_computed(s)
    np.testing.assert_array_equal(pd.routes.rows(0, 4), source_rows(ids[:4]))
    np.testing.assert_array_equal(pd.routes.rows(4, 17), fake_rows(ids[4:17], 4))
    assert pd.num_transferred_tokens == 4


def test_refused_load_is_a_request_error_and_nothing_leaks():
    sched, pool, store, remote = setup()
    remote.refuse = "KV load refused: 64 KV loads in flight"
    pd = new_req("pd", list(range(700, 713)))
    remote.offer["pd"] = 3
    sched.add(pd)
    out = sched.schedule()
    assert out.failed == [pd] and pd.abort_message == remote.refuse and pool.num_used == 0


def test_loading_requests_count_against_max_num_seqs():
    sched, pool, store, remote = setup()
    sched.max_num_seqs = 2
    for i in range(2):
        remote.offer[f"pd{i}"] = 2
        sched.add(new_req(f"pd{i}", list(range(800 + 20 * i, 809 + 20 * i))))
    late = new_req("late", [1, 2, 3])
    sched.add(late)
    assert sched.schedule().empty and sched.num_loading == 2 and late.status is RequestStatus.WAITING
    remote.complete("pd0")
    ids, _ = scheduled_ids(sched)
    assert ids == ["pd0"] and late.status is RequestStatus.WAITING  # pd0 took its reserved slot
