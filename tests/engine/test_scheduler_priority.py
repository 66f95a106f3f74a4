"""Priority classes in the scheduler and session-step admission in the KV cache manager, without a
model: admission order, budget, preemption victims, requests that arrive holding blocks, and
copy-on-write of a shared partial tail block."""

from __future__ import annotations

import pytest

from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.request import Request, RequestStatus
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scheduler import PRIORITY_BATCH, PRIORITY_INTERACTIVE, Scheduler
from execstate.identity.provenance import Provenance
from execstate.state.block_holds import HeldBlocks
from execstate.state.block_pool import BlockPool

BS = 4
PROV = Provenance(model_id="m", weights_version="w1", dtype="float32", numerics="eager+torch-cpu")
INTER, B = PRIORITY_INTERACTIVE, PRIORITY_BATCH


def make(num_blocks: int = 32, budget: int = 64, seqs: int = 8) -> tuple[Scheduler, BlockPool, KVCacheManager]:
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, BS, PROV, True, None)
    return Scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=seqs), pool, kv


def req(rid: str, n: int, priority: int = B, max_tokens: int = 8) -> Request:
    base = 3 + 37 * sum(map(ord, rid)) % 400  # distinct prompts: no prefix hits between requests
    prompt = [base + i for i in range(n)]
    return Request(rid, prompt, SamplingParams(temperature=0, max_tokens=max_tokens), max_model_len=256,
                   priority=priority)


def step(sched: Scheduler) -> list[tuple[str, int]]:
    """Schedule, 'compute', sample token 7 for sampling rows; return (id, tokens) scheduled."""
    out = sched.schedule()
    for s in out.scheduled:
        sched.on_computed(s)
        if s.samples:
            s.request.output_token_ids.append(7)
    return [(s.request.request_id, s.num_new_tokens) for s in out.scheduled]


def ids(reqs: list[Request]) -> list[str]:
    return [r.request_id for r in reqs]


def test_admission_order_is_by_class_then_arrival():
    sched, _, _ = make(seqs=2)
    for r in (req("b1", 5), req("b2", 5), req("i1", 5, INTER), req("i2", 5, INTER)):
        sched.add(r)
    assert ids(sched.waiting) == ["i1", "i2", "b1", "b2"]
    assert step(sched) == [("i1", 5), ("i2", 5)]
    assert ids(sched.waiting) == ["b1", "b2"]


def test_interactive_step_takes_the_budget_before_a_running_batch_prefill():
    sched, _, _ = make(budget=16)
    sched.add(req("b", 40))
    assert step(sched) == [("b", 16)]  # chunked prefill, 24 tokens to go
    sched.add(req("i", 5, INTER))
    assert step(sched) == [("i", 5), ("b", 11)]
    assert ids(sched.running) == ["i", "b"]
    assert step(sched) == [("i", 1), ("b", 13)]


def test_without_priorities_nothing_changes():
    sched, _, _ = make(budget=16)
    sched.add(req("b", 40))
    step(sched)
    sched.add(req("c", 5))
    assert step(sched) == [("b", 16)]  # running first, oldest first; c waits for budget
    assert step(sched) == [("b", 8), ("c", 5)]


def test_a_full_slot_table_of_batch_requests_yields_to_an_interactive_step():
    sched, pool, _ = make(seqs=2)
    sched.add(req("b1", 5))
    sched.add(req("b2", 5))
    step(sched)
    sched.add(req("b3", 5))
    sched.add(req("i", 5, INTER))
    out = sched.schedule()
    assert ids(out.preempted) == ["b2"]  # the newest of the lowest class
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("i", 5), ("b1", 1)]
    assert ids(sched.waiting) == ["b2", "b3"]  # back to the front of its class
    assert sched.waiting[0].status is RequestStatus.PREEMPTED and sched.waiting[0].num_computed_tokens == 0
    pool.check_integrity()


def test_interactive_requests_never_preempt_their_own_class():
    sched, _, _ = make(seqs=2)
    for r in (req("i1", 5, INTER), req("i2", 5, INTER)):
        sched.add(r)
    step(sched)
    sched.add(req("i3", 5, INTER))
    out = sched.schedule()
    assert not out.preempted and ids(sched.waiting) == ["i3"]


def test_blocks_are_taken_from_the_lowest_class_newest_first():
    sched, pool, _ = make(num_blocks=6, seqs=8)
    sched.add(req("b1", 8))  # 2 blocks
    sched.add(req("b2", 8))
    step(sched)
    sched.add(req("i", 12, INTER))  # 3 blocks + room: needs a batch victim
    out = sched.schedule()
    assert ids(out.preempted) == ["b2"]
    assert [s.request.request_id for s in out.scheduled] == ["i", "b1"]
    pool.check_integrity()


def test_a_running_interactive_request_short_of_blocks_preempts_batch_first():
    sched, _, _ = make(num_blocks=5, seqs=8)
    sched.add(req("i", 4, INTER, max_tokens=20))  # 1 block, then grows
    step(sched)
    sched.add(req("b1", 7))
    sched.add(req("b2", 7))
    step(sched)
    for _ in range(30):
        assert sched.running[0].request_id == "i"
        if any(r.request_id == "b2" for r in sched.waiting):
            break
        step(sched)
    else:
        raise AssertionError("the pool never ran short")
    assert ids(sched.running) == ["i", "b1"] and sched.running[0].num_preemptions == 0


# -- requests that arrive holding blocks (session steps) --------------------------------------------


def held_request(pool: BlockPool, kv: KVCacheManager, n_held: int, n_total: int) -> tuple[Request, HeldBlocks]:
    """A step request whose first ``n_held`` tokens' KV sits in blocks a session holds, plus a
    checkpoint pinning the same blocks."""
    r = req("s", n_total, INTER)
    blocks = pool.allocate(-(-n_held // BS))
    own = kv.holds.adopt(HeldBlocks(blocks, n_held))
    cp = kv.holds.pin(own)
    kv.holds.hand_over(own)
    r.block_ids, r.num_computed_tokens, r.session.keep_blocks = list(blocks), n_held, True
    return r, cp


def test_a_held_request_skips_lookup_and_copies_only_its_shared_partial_tail():
    sched, pool, kv = make()
    r, cp = held_request(pool, kv, n_held=6, n_total=9)  # blocks: [full, partial(2 of 4)]
    full, tail = cp.block_ids
    sched.add(r)
    out = sched.schedule()
    assert [(s.request.request_id, s.num_new_tokens, s.num_computed_before) for s in out.scheduled] == [("s", 3, 6)]
    assert len(out.block_copies) == 1
    src, dst = out.block_copies[0]
    assert src == tail and dst not in (full, tail) and r.block_ids[:2] == [full, dst] and len(r.block_ids) == 3
    assert pool.ref_count(full) == 2  # shared as is: full blocks are never written again
    assert pool.ref_count(tail) == 1 and pool.ref_count(dst) == 1  # the checkpoint keeps the original
    assert kv.num_block_copies == 1 and kv.take_block_copies() == []
    pool.check_integrity()


@pytest.mark.parametrize(("n_held", "copies"), [(8, 0), (5, 1)])
def test_copy_only_when_the_tail_is_partial_and_shared(n_held, copies):
    sched, pool, kv = make()
    r, cp = held_request(pool, kv, n_held, n_held + 2)
    sched.add(r)
    assert len(sched.schedule().block_copies) == copies
    kv.holds.release(cp)
    r2, _ = held_request(pool, kv, 5, 7)
    r2.request_id = "s2"
    kv.holds.release(_)  # nobody else holds this tail: written in place
    sched.add(r2)
    assert sched.schedule().block_copies == []


def test_a_held_request_that_does_not_fit_changes_nothing():
    sched, pool, kv = make(num_blocks=3)
    r, cp = held_request(pool, kv, n_held=6, n_total=20)  # needs the copy + 3 more blocks; 1 free
    sched.add(r)
    before = [pool.ref_count(b) for b in range(3)]
    out = sched.schedule()
    assert out.scheduled == [] and out.block_copies == [] and [pool.ref_count(b) for b in range(3)] == before
    assert r.block_ids == cp.block_ids and ids(sched.waiting) == ["s"]


def test_finish_hands_the_computed_blocks_back_and_frees_the_rest():
    sched, pool, kv = make()
    r, cp = held_request(pool, kv, n_held=6, n_total=9)
    sched.add(r)
    step(sched)  # 9 computed, 1 sampled: 10 tokens, blocks for 9 (3 blocks)
    assert r.num_computed_tokens == 9 and len(r.block_ids) == 3
    sched.finish(r, RequestStatus.FINISHED_LENGTH)
    back = r.session.returned_blocks
    assert back is not None and kv.holds.holds(back) and back.num_tokens == 9 and len(back.block_ids) == 3
    assert back.block_ids[0] == cp.block_ids[0] and r.block_ids == []
    kv.holds.release(back)
    kv.holds.release(cp)
    assert pool.num_used == 0
    pool.check_integrity()


def test_a_preempted_held_request_recomputes_and_still_hands_back():
    sched, pool, kv = make(num_blocks=4, seqs=8)
    r, cp = held_request(pool, kv, n_held=6, n_total=8)
    kv.holds.release(cp)
    sched.add(r)
    step(sched)
    sched._preempt(sched.running.pop())
    assert r.block_ids == [] and r.num_computed_tokens == 0 and pool.num_used == 0
    step(sched)  # admitted again without held blocks: a normal admission, all tokens recomputed
    assert r.num_computed_tokens == r.num_tokens - 1
    sched.finish(r, RequestStatus.FINISHED_STOPPED)
    assert r.session.returned_blocks is not None and r.session.returned_blocks.num_tokens == r.num_tokens - 1
    kv.holds.release(r.session.returned_blocks)
    assert pool.num_used == 0


def test_a_drain_admits_its_requests_past_a_newer_interactive_one_at_the_head():
    """A weight update drains b1 and b2 (``admit_only``); an interactive step sent after it begins
    sorts ahead of them in the queue but is passed over, not waited on: the drain ends."""
    sched, _, _ = make(seqs=4)
    b1, b2 = req("b1", 5, max_tokens=2), req("b2", 5, max_tokens=2)
    sched.add(b1)
    sched.add(b2)
    sched.admit_only = {b1, b2}
    sched.add(req("i", 5, INTER))
    assert ids(sched.waiting) == ["i", "b1", "b2"]
    assert step(sched) == [("b1", 5), ("b2", 5)]
    assert ids(sched.waiting) == ["i"] and ids(sched.running) == ["b1", "b2"]
    assert step(sched) == [("b1", 1), ("b2", 1)]
    for r in (b1, b2):
        sched.finish(r, RequestStatus.FINISHED_LENGTH)
    assert step(sched) == [] and ids(sched.waiting) == ["i"]  # still held for the switch
    sched.admit_only = None
    assert step(sched) == [("i", 5)]
