"""Scheduler + KV cache manager state machines, driven without a model.

A fake "forward pass" writes deterministic route rows (a function of token id and
position) so route bookkeeping can be checked exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.request import Request, RequestStatus
from execstate.engine.route_trace import MissingRoutesError, RouteTrace
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scheduler import Scheduler
from execstate.identity.provenance import Provenance
from execstate.state.block_pool import BlockPool
from execstate.state.route_store import RouteStore

BS, L, K, E = 4, 2, 2, 8
PROV = Provenance(model_id="m", weights_version="w1", dtype="float32", numerics="eager+torch-cpu")


def fake_rows(tokens: list[int], start: int) -> np.ndarray:
    rows = np.zeros((len(tokens), L, K), np.int16)
    for i, t in enumerate(tokens):
        for m in range(L):
            rows[i, m] = [(t + m) % E, (t + m + 1) % E]
    return rows


def make(num_blocks: int = 16, budget: int = 64, routes: bool = True):
    store = RouteStore(BS, L, K, E) if routes else None
    pool = BlockPool(num_blocks, on_evict=store.on_block_evicted if store else None)
    kv = KVCacheManager(pool, BS, PROV, True, store)
    return Scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=8), pool, store


def new_req(rid: str, prompt: list[int], max_tokens: int = 4) -> Request:
    r = Request(rid, prompt, SamplingParams(temperature=0, max_tokens=max_tokens), max_model_len=256)
    r.routes = RouteTrace(L, K)
    return r


def run_step(sched: Scheduler, next_token: int = 7) -> list[Request]:
    """Schedule, 'compute' (fill routes, commit), sample ``next_token``; return finished."""
    out = sched.schedule()
    finished = []
    for s in out.scheduled:
        req = s.request
        toks = req.all_token_ids[s.num_computed_before : s.num_computed_before + s.num_new_tokens]
        req.routes.fill(s.num_computed_before, fake_rows(toks, s.num_computed_before))
        sched.on_computed(s)
        if s.samples:
            req.output_token_ids.append(next_token)
            if len(req.output_token_ids) >= req.max_new_tokens:
                sched.finish(req, RequestStatus.FINISHED_LENGTH)
                finished.append(req)
    return finished


def drain(sched: Scheduler) -> None:
    for _ in range(200):
        if not sched.has_unfinished:
            return
        run_step(sched)
    raise AssertionError("scheduler did not drain")


def test_prefix_hit_copies_recorded_rows_and_leases():
    sched, pool, store = make()
    a = new_req("a", list(range(10)))  # 2 full blocks + tail
    sched.add(a)
    drain(sched)
    assert a.num_cached_tokens == 0
    b = new_req("b", list(range(10)) + [99, 98])
    sched.add(b)
    run_step(sched)
    assert b.num_cached_tokens == 8  # two full blocks hit, tail recomputed
    np.testing.assert_array_equal(b.routes.rows(0, 8), fake_rows(list(range(8)), 0))
    assert all(store.lease_count(k) == 1 for k in b.cache.leased_keys)
    drain(sched)
    assert all(store.lease_count(k) == 0 for k in b.cache.block_keys[:2])
    pool.check_integrity()
    store.check_integrity()
    assert pool.num_used == 0


def test_whole_prompt_cached_still_computes_last_token():
    sched, pool, _ = make()
    a = new_req("a", list(range(8)))
    sched.add(a)
    drain(sched)
    b = new_req("b", list(range(8)))
    sched.add(b)
    out = sched.schedule()
    assert b.num_cached_tokens == 4  # block 2 holds the last token: it must be recomputed
    assert out.scheduled[0].num_new_tokens == 4


def test_missing_route_record_is_a_miss_not_zeros():
    sched, pool, store = make()
    a = new_req("a", list(range(12)))
    sched.add(a)
    drain(sched)
    store.drop(a.cache.block_keys[1])  # second block's record lost
    b = new_req("b", list(range(12)) + [5])
    sched.add(b)
    run_step(sched)
    assert b.num_cached_tokens == 4  # only the first unit is whole
    np.testing.assert_array_equal(b.routes.rows(0, 13), fake_rows(list(range(12)) + [5], 0))


def test_weight_update_makes_old_units_unreachable():
    sched, pool, _ = make()
    a = new_req("a", list(range(12)))
    sched.add(a)
    drain(sched)
    sched.kv.set_provenance(PROV.replace(weights_version="w2"))
    b = new_req("b", list(range(12)))
    sched.add(b)
    run_step(sched)
    assert b.num_cached_tokens == 0
    assert pool.num_cached >= 3  # old units still in the pool, just never hit


def test_preemption_keeps_rows_and_tokens():
    # 6 blocks of 4 tokens; two requests that each grow to 3+ blocks force a preemption.
    sched, pool, store = make(num_blocks=6, budget=64)
    a = new_req("a", list(range(10)), max_tokens=6)
    b = new_req("b", list(range(20, 30)), max_tokens=6)
    sched.add(a)
    sched.add(b)
    finished = []
    for _ in range(100):
        finished += run_step(sched)
        pool.check_integrity()
        if not sched.has_unfinished:
            break
    assert sched.num_preemptions >= 1
    assert {r.request_id for r in finished} == {"a", "b"}
    for r in (a, b):
        assert r.output_token_ids == [7] * 6
        n = r.num_tokens
        np.testing.assert_array_equal(r.routes.result(n, 0), fake_rows(r.all_token_ids[: n - 1], 0))
    assert pool.num_used == 0
    store.check_integrity()


def test_route_trace_fails_closed():
    t = RouteTrace(L, K)
    t.fill(0, fake_rows([1, 2, 3], 0))
    with pytest.raises(MissingRoutesError):
        t.result(5, 0)
    with pytest.raises(ValueError, match="contiguous"):
        t.fill(5, fake_rows([1], 5))
    t.fill(0, fake_rows([9, 9, 9, 9], 0))  # keep-first: rows 0..2 unchanged, row 3 new
    np.testing.assert_array_equal(t.result(5, 0), np.concatenate([fake_rows([1, 2, 3], 0), fake_rows([9], 3)]))
    np.testing.assert_array_equal(t.result(5, 2), t.result(5, 0)[2:])


def test_token_budget_chunks_prefill():
    sched, pool, _ = make(budget=8)
    a = new_req("a", list(range(20)))
    sched.add(a)
    chunks = []
    while a.output_token_ids == []:
        out = sched.schedule()
        chunks.append(out.scheduled[0].num_new_tokens)
        for s in out.scheduled:
            s.request.routes.fill(s.num_computed_before, fake_rows([0] * s.num_new_tokens, 0))
            sched.on_computed(s)
            if s.samples:
                s.request.output_token_ids.append(1)
    assert chunks == [8, 8, 4]


def test_abort_releases_everything():
    sched, pool, store = make()
    a = new_req("a", list(range(10)))
    sched.add(a)
    run_step(sched)
    assert pool.num_used > 0
    assert sched.abort("a") is a
    assert a.status is RequestStatus.FINISHED_ABORTED
    assert pool.num_used == 0
    assert sched.abort("a") is None
    pool.check_integrity()


def test_route_record_outlives_evicted_block_while_a_request_needs_it():
    sched, pool, store = make(num_blocks=8)
    a = new_req("a", list(range(9)))
    sched.add(a)
    drain(sched)
    b = new_req("b", list(range(9)) + [50])
    sched.add(b)
    run_step(sched)
    assert b.num_cached_tokens == 8
    hit_keys = b.cache.block_keys[:2]
    sched._preempt(b)  # b gives its blocks back but still owes those rows
    sched.running.remove(b)
    taken = pool.allocate(pool.num_free)  # evicts every cached block
    assert all(pool.lookup(k) is None for k in hit_keys)
    assert all(store.has(k) for k in hit_keys)  # leased by b: still alive
    pool.free(taken)
    drain(sched)
    assert b.is_finished
    np.testing.assert_array_equal(b.routes.rows(0, 8), fake_rows(list(range(8)), 0))
    # b recomputed the evicted blocks and re-committed them: each unit is whole again
    # (KV block cached and its record alive), and no lease is left behind.
    assert all(pool.lookup(k) is not None and store.has(k) for k in hit_keys)
    assert all(store.lease_count(k) == 0 for k in hit_keys)
    assert store.num_pending_drop == 0
    store.check_integrity()
    pool.check_integrity()
