"""The hold after an interactive step (``engine/interactive_hold.py``), without a model: the state
machine on a stepped clock, the scheduler keeping batch work off the engine while it lasts, and
an engine step over a random model waiting in it instead of running batch work."""

from __future__ import annotations

import threading
import time

import pytest
from test_scheduler_priority import BS, INTER, PROV, ids, req, step

from execstate.engine.config import EngineConfig
from execstate.engine.interactive_hold import InteractiveHold
from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.request import RequestStatus
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scheduler import PRIORITY_INTERACTIVE, Scheduler
from execstate.state.block_pool import BlockPool


class Clock:
    """Seconds that move only when a test moves them."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(hold_s: float, batch_budget: int | None = 0, clock: Clock | None = None) -> tuple[Scheduler, Clock]:
    clock = clock or Clock()
    kv = KVCacheManager(BlockPool(64), BS, PROV, True, None)
    return Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8, batch_budget=batch_budget,
                     hold=InteractiveHold(hold_s, clock)), clock


def test_the_hold_lasts_hold_s_from_its_start():
    clock = Clock()
    hold = InteractiveHold(0.02, clock)
    assert not hold.held and hold.remaining() == 0.0
    hold.start()
    assert hold.held and hold.remaining() == pytest.approx(0.02)
    clock.t += 0.015
    assert hold.remaining() == pytest.approx(0.005)
    hold.start()  # a later step's end renews it from now
    assert hold.remaining() == pytest.approx(0.02) and hold.num_holds == 2
    clock.t += 0.02
    assert not hold.held and hold.remaining() == 0.0


def test_a_zero_hold_never_holds():
    hold = InteractiveHold(0.0, Clock())
    hold.start()
    assert not hold.held and hold.num_holds == 0


@pytest.mark.parametrize("bad", [-0.01, 1.5, True, "0.02", None])
def test_a_bad_hold_is_refused(bad):
    with pytest.raises(ValueError, match="interactive hold"):
        InteractiveHold(bad)


def test_batch_work_waits_out_the_hold_after_a_front_step_then_gets_whole_steps():
    sched, clock = make(0.02)
    for k in range(3):
        sched.add(req(f"b{k}", 4))
    assert step(sched) == [("b0", 4), ("b1", 4), ("b2", 4)]
    sched.add(req("i", 3, INTER))
    assert step(sched) == [("i", 3)]  # budget 0: the batch decodes skip the front's step
    sched.finish(sched.running[0], RequestStatus.FINISHED_STOPPED)  # the front's step ended
    assert sched.hold_remaining() == pytest.approx(0.02)
    assert step(sched) == []  # held: no batch-only step the next front step would wait out
    assert ids(sched.running) == ["b0", "b1", "b2"] and sched.num_preemptions == 0
    clock.t += 0.005
    assert sched.hold_remaining() == pytest.approx(0.015)
    sched.add(req("i2", 2, INTER))  # the next front step, inside the hold: served at once
    assert sched.hold_remaining() == 0.0
    assert step(sched) == [("i2", 2)]
    sched.finish(sched.running[0], RequestStatus.FINISHED_STOPPED)
    clock.t += 0.019
    assert step(sched) == []  # its end started a new hold
    clock.t += 0.002
    assert sched.hold_remaining() == 0.0
    assert step(sched) == [("b0", 1), ("b1", 1), ("b2", 1)]  # no front step came: the batch runs again


def test_inside_a_front_step_the_batch_budget_still_governs():
    sched, _ = make(0.02, batch_budget=2)
    for k in range(3):
        sched.add(req(f"b{k}", 4))
    step(sched)
    sched.add(req("i", 3, INTER, max_tokens=2))
    assert step(sched) == [("i", 3), ("b0", 1), ("b1", 1)]
    sched.finish(sched.running[0], RequestStatus.FINISHED_STOPPED)
    assert step(sched) == []  # the hold gives the batch no tokens, whatever the budget


def test_an_aborted_front_step_holds_too_and_batch_only_engines_never_hold():
    sched, _ = make(0.02)
    sched.add(req("b", 4))
    sched.add(req("i", 3, INTER))
    step(sched)
    assert sched.abort("i") is not None
    assert sched.hold_remaining() == pytest.approx(0.02)
    plain, _ = make(0.02)
    plain.add(req("b", 4))
    step(plain)
    plain.finish(plain.running[0], RequestStatus.FINISHED_STOPPED)  # a batch request's end: no hold
    assert plain.hold_remaining() == 0.0 and plain.hold is not None and plain.hold.num_holds == 0


def test_nothing_held_back_means_no_wait():
    sched, _ = make(0.02)
    sched.add(req("i", 3, INTER))
    step(sched)
    sched.finish(sched.running[0], RequestStatus.FINISHED_STOPPED)
    assert sched.hold is not None and sched.hold.held
    assert sched.hold_remaining() == 0.0  # no batch work waiting: the engine goes idle as ever


def test_an_engine_step_waits_in_the_hold_and_a_command_ends_the_wait(dense_dir):
    eng = LLMEngine(EngineConfig(model=str(dense_dir), max_num_seqs=4, num_kv_blocks=64, max_model_len=256,
                                 interactive_batch_budget=0, interactive_hold_s=0.5))

    def front_step(rid: str, prompt: list[int]) -> None:
        eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1), rid)
        eng.requests[rid].priority = PRIORITY_INTERACTIVE  # a session step's class (waiting alone: in order)

    eng.add_request([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), "b")
    eng.step()
    front_step("i", [9, 10, 11])
    assert [(o.request_id, o.finished) for o in eng.step()] == [("i", True)]
    held = eng.scheduler.hold_remaining()
    assert 0.3 < held <= 0.5
    t0 = time.monotonic()
    assert eng.step() == []  # held: the batch request does not step; the engine waits out the hold
    assert held - 0.02 <= time.monotonic() - t0 < held + 0.5
    assert eng.scheduler.hold_remaining() == 0.0
    assert len(eng.requests["b"].output_token_ids) == 1
    front_step("i2", [9, 10, 12])
    assert [o.request_id for o in eng.step() if o.finished] == ["i2"]  # at once, alone (budget 0)
    assert len(eng.requests["b"].output_token_ids) == 1
    timer = threading.Timer(0.05, eng.wake)  # a command's submission wakes the held step
    timer.start()
    t0 = time.monotonic()
    assert eng.step() == [] and time.monotonic() - t0 < 0.3  # well before the hold's 0.5 s
    timer.join()
    assert len(eng.requests["b"].output_token_ids) == 1
