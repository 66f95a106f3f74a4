"""The batch budget under interactive work (``Scheduler(batch_budget=...)``), without a model: while
an interactive request runs or waits, lower classes share at most ``batch_budget`` tokens a step
(chunked prefills cut, decodes beyond it skipped, never preempted); without one they get it all."""

from __future__ import annotations

import pytest
from test_scheduler_priority import BS, INTER, PROV, ids, req, step

from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.request import RequestStatus
from execstate.engine.scheduler import Scheduler
from execstate.state.block_pool import BlockPool


def make(batch_budget: int | None, budget: int = 64, seqs: int = 8, num_blocks: int = 64) -> Scheduler:
    return Scheduler(KVCacheManager(BlockPool(num_blocks), BS, PROV, True, None), max_num_batched_tokens=budget,
                     max_num_seqs=seqs, batch_budget=batch_budget)


def test_a_batch_prefill_is_cut_to_the_batch_budget_while_an_interactive_step_runs():
    sched = make(batch_budget=8)
    sched.add(req("b", 100))
    assert step(sched) == [("b", 64)]  # alone: the whole step budget
    sched.add(req("i", 5, INTER))
    assert step(sched) == [("i", 5), ("b", 8)]
    assert step(sched) == [("i", 1), ("b", 8)]
    sched.finish(sched.running[0], RequestStatus.FINISHED_STOPPED)  # the front's step ended
    assert step(sched) == [("b", 20)]  # the rest of the prompt, uncapped again


def test_batch_decodes_past_the_budget_wait_without_losing_their_blocks():
    sched = make(batch_budget=2)
    for k in range(3):
        sched.add(req(f"b{k}", 4))
    assert step(sched) == [("b0", 4), ("b1", 4), ("b2", 4)]
    held = {r.request_id: list(r.block_ids) for r in sched.running}
    sched.add(req("i", 3, INTER))
    assert step(sched) == [("i", 3), ("b0", 1), ("b1", 1)]  # b2 skipped this step, oldest first
    assert ids(sched.running) == ["i", "b0", "b1", "b2"] and sched.num_preemptions == 0
    assert list(sched.running[3].block_ids) == held["b2"]
    sched.finish(sched.running[0], RequestStatus.FINISHED_STOPPED)
    assert step(sched) == [("b0", 1), ("b1", 1), ("b2", 1)]


def test_a_waiting_batch_request_is_admitted_within_the_budget():
    sched = make(batch_budget=6)
    sched.add(req("i", 4, INTER, max_tokens=50))
    sched.add(req("b", 30))
    assert step(sched) == [("i", 4), ("b", 6)]
    assert step(sched) == [("i", 1), ("b", 6)]


def test_a_zero_budget_holds_batch_work_while_the_interactive_request_lasts():
    sched = make(batch_budget=0)
    sched.add(req("b", 10))
    sched.add(req("i", 4, INTER))
    assert step(sched) == [("i", 4)]
    assert ids(sched.waiting) == ["b"]


@pytest.mark.parametrize("batch_budget", [None, 8])
def test_without_interactive_work_the_batch_classes_get_the_whole_budget(batch_budget):
    sched = make(batch_budget=batch_budget, budget=32)
    sched.add(req("b1", 20))
    sched.add(req("b2", 20))
    assert step(sched) == [("b1", 20), ("b2", 12)]


def test_without_a_batch_budget_the_interactive_step_shares_the_step_as_before():
    sched = make(batch_budget=None)
    sched.add(req("b", 100))
    step(sched)
    sched.add(req("i", 5, INTER))
    assert step(sched) == [("i", 5), ("b", 36)]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_a_bad_batch_budget_is_refused(bad):
    with pytest.raises(ValueError, match="batch_budget"):
        make(batch_budget=bad)
