"""Failure isolation in the engine: a step that raises fails only its own requests.

The fault is injected by the test (a test double replacing the engine's runner or
sampler for one step); the product has no switch for it.
"""

from __future__ import annotations

import pytest

from execstate import SamplingParams
from execstate.engine import step_results as step_results_module
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.scheduler import SchedulerOutput
from execstate.engine.step_failure import EngineCorruptedError, EngineFatalError

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
A = [5, 17, 42, 99, 250, 311, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]  # > one block
B = [21, 22, 23, 24, 25, 26]
PROBE = [40, 41, 42, 43, 44, 45, 46, 47, 48]


def engine(moe_dir, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(moe_dir), seed=0, enable_return_routed_experts=True, **kw))


def run(eng: LLMEngine) -> dict:
    finals = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


@pytest.fixture(scope="module")
def reference(moe_dir) -> dict[str, list[int]]:
    eng = engine(moe_dir)
    for rid, prompt in (("a", A), ("b", B), ("probe", PROBE)):
        eng.add_request(prompt, GREEDY, rid)
    return {rid: out.outputs[0].token_ids for rid, out in run(eng).items()}


class FailOnce:
    """Test double: raises instead of calling ``real`` on its ``when``-th call."""

    def __init__(self, real, when: int = 1) -> None:
        self.real, self.when, self.calls = real, when, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.when:
            raise RuntimeError("injected step fault")
        return self.real(*args, **kwargs)


@pytest.mark.parametrize("where", ["runner", "sampler"])
def test_failing_step_fails_its_requests_and_the_rest_continue(moe_dir, reference, monkeypatch, where):
    eng = engine(moe_dir, max_num_seqs=1)  # "a" runs, "b" waits: only "a" is in the failing step
    eng.add_request(A, GREEDY, "a")
    eng.add_request(B, GREEDY, "b")
    outs = eng.step() + eng.step() + eng.step()  # prefill of "a", then two decodes
    assert [o.request_id for o in outs] == ["a"] * 3
    if where == "runner":  # the forward pass raises: nothing of this step was computed
        monkeypatch.setattr(eng.runner, "execute", FailOnce(eng.runner.execute))
    else:  # sampling raises after the forward pass committed the step's blocks
        monkeypatch.setattr(step_results_module, "sample", FailOnce(step_results_module.sample))
    failed = eng.step()
    assert [o.request_id for o in failed] == ["a"]
    out = failed[0]
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert "injected step fault" in out.error and "engine step" in out.error
    assert out.outputs[0].token_ids == reference["a"][:3]  # what it had produced before the fault
    eng.check_integrity()
    assert eng.block_pool.num_used == 0  # "a" released its blocks; "b" has not been scheduled yet
    assert "a" not in eng.requests
    finals = run(eng)
    assert finals["b"].outputs[0].token_ids == reference["b"] and finals["b"].error is None
    eng.add_request(PROBE, GREEDY, "probe")
    assert run(eng)["probe"].outputs[0].token_ids == reference["probe"]
    eng.check_integrity()
    assert eng.block_pool.num_used == 0


def test_failing_step_with_several_requests_fails_them_all(moe_dir, reference, monkeypatch):
    eng = engine(moe_dir)
    eng.add_request(A, GREEDY, "a")
    eng.add_request(B, GREEDY, "b")
    eng.step()
    monkeypatch.setattr(eng.runner, "execute", FailOnce(eng.runner.execute))
    failed = eng.step()
    assert sorted(o.request_id for o in failed) == ["a", "b"]
    assert all(o.outputs[0].finish_reason == "abort" and len(o.outputs[0].token_ids) == 1 for o in failed)
    assert not eng.has_unfinished_requests() and eng.block_pool.num_used == 0
    eng.add_request(PROBE, GREEDY, "probe")
    assert run(eng)["probe"].outputs[0].token_ids == reference["probe"]


def test_failure_that_breaks_pool_integrity_stops_the_engine(moe_dir, monkeypatch):
    eng = engine(moe_dir)
    eng.add_request(A, GREEDY, "a")
    eng.step()

    def corrupt(sched):
        eng.block_pool._blocks[sched.scheduled[0].request.block_ids[0]].ref_count += 5  # a leaked reference
        raise RuntimeError("injected fault after corrupting the pool")

    monkeypatch.setattr(eng.runner, "execute", corrupt)
    with pytest.raises(EngineCorruptedError, match="inconsistent") as info:
        eng.step()
    assert "injected fault" in str(info.value) and isinstance(info.value.__cause__, RuntimeError)


def test_broken_engine_invariant_is_fatal(moe_dir, monkeypatch):
    eng = engine(moe_dir)
    eng.add_request(A, GREEDY, "a")
    monkeypatch.setattr(eng.scheduler, "schedule", SchedulerOutput)  # schedules nothing although "a" waits
    with pytest.raises(EngineFatalError, match="no progress"):
        eng.step()


def test_step_failure_before_scheduling_fails_every_unfinished_request(moe_dir, monkeypatch):
    eng = engine(moe_dir)
    eng.add_request(A, GREEDY, "a")
    eng.add_request(B, GREEDY, "b")
    monkeypatch.setattr(eng.scheduler, "schedule", FailOnce(eng.scheduler.schedule))
    failed = eng.step()
    assert sorted(o.request_id for o in failed) == ["a", "b"]
    assert all(o.outputs[0].finish_reason == "abort" for o in failed)
    eng.check_integrity()
    assert eng.block_pool.num_used == 0 and not eng.has_unfinished_requests()
