"""Where a front step's time goes (``duplex_front_time``) on a hand-built trace with known parts,
and the engine's step trace (``engine/step_trace.py``) on real scheduled requests."""

from __future__ import annotations

import time

import pytest

from execstate.engine.request import Request
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scheduler import PRIORITY_BATCH, PRIORITY_INTERACTIVE, ScheduledRequest
from execstate.engine.step_trace import StepTrace, TracedStep
from execstate_bench.duplex_front_time import COMPONENTS, front_time, split_step


def batch(t0: float, t1: float, cpu: float | None = None) -> TracedStep:
    return TracedStep(t0, t1, t1 - t0 if cpu is None else cpu, 0, 8, ())


def front(t0: float, t1: float, rid: str, arrival: float, cpu: float | None = None) -> TracedStep:
    return TracedStep(t0, t1, t1 - t0 if cpu is None else cpu, 1, 0, ((rid, arrival),))


def test_a_front_step_behind_a_batch_step_splits_into_its_known_parts():
    # the agent calls at 10.000 while a batch step runs until 10.050; the request arrives at
    # 10.051, its steps run 10.052-10.072 (5 ms of it off CPU) and 10.073-10.093; the agent sees the
    # end at 10.094
    steps = [batch(9.990, 10.050), front(10.052, 10.072, "r", 10.051, cpu=0.015), front(10.073, 10.093, "r", 10.051)]
    parts = split_step(10.000, 0.094, "r", 10.051, steps)
    assert parts["wait_in_flight_ms"] == pytest.approx(0.050)
    assert parts["host_in_ms"] == pytest.approx(0.001)
    assert parts["wait_engine_ms"] == pytest.approx(0.001)
    assert parts["forward_ms"] == pytest.approx(0.040)
    assert parts["forward_off_cpu_ms"] == pytest.approx(0.005)
    assert parts["between_ms"] == pytest.approx(0.001)
    assert parts["host_out_ms"] == pytest.approx(0.001)
    assert parts["batch_steps_between"] == 0.0
    total = sum(v for k, v in parts.items() if k in COMPONENTS and k != "forward_off_cpu_ms")
    assert total == pytest.approx(0.094)  # the parts cover the step exactly


def test_front_time_matches_steps_to_requests_and_skips_drafted_steps():
    steps = [front(1.001, 1.081, "a", 1.0005), batch(1.082, 1.132), front(1.133, 1.213, "b", 1.1325),
             front(2.001, 2.041, "c", 2.0005)]
    # three agent steps: "a", "b" (which waited out the batch step started in the gap), and a
    # drafted one at 3.0 that ran no engine request
    out = front_time([1.000, 1.082, 3.0], [0.082, 0.132, 0.0001], steps)
    assert out["n"] == 2
    assert out["per_step_ms"][0] == [0.5, 0.0, 0.5, 80.0, 0.0, 0.0, 1.0]
    assert out["per_step_ms"][1] == [0.5, 50.0, 0.5, 80.0, 0.0, 0.0, 1.0]
    assert out["wait_in_flight_ms"] == {"mean": 25.0, "p50": 25.0}
    assert out["batch_only_step_ms"]["n"] == 1 and out["batch_only_step_ms"]["mean"] == pytest.approx(50.0)


def test_the_step_trace_records_classes_tokens_and_arrivals():
    params = SamplingParams(temperature=0.0, max_tokens=4)
    i = Request("i", [1, 2, 3], params, max_model_len=64, priority=PRIORITY_INTERACTIVE)
    b = Request("b", [4, 5], params, max_model_len=64, priority=PRIORITY_BATCH)
    trace = StepTrace(max_steps=2)
    trace.begin()
    t = time.thread_time()
    while time.thread_time() - t < 0.01:  # 10 ms of this thread's CPU
        pass
    trace.end([ScheduledRequest(i, 3, 0), ScheduledRequest(b, 1, 1)])
    trace.begin()
    trace.end([])  # an empty step is not recorded
    (rec,) = trace.records
    assert (rec.interactive_tokens, rec.batch_tokens, rec.interactive) == (3, 1, (("i", i.arrival_time),))
    assert rec.cpu_s >= 0.01 and rec.wall_s >= rec.cpu_s - 1e-3 and rec.t0 >= i.arrival_time
    for _ in range(3):
        trace.begin()
        trace.end([ScheduledRequest(b, 1, 2)])
    assert len(trace.records) == 2  # the last max_steps
    with pytest.raises(ValueError, match="max_steps"):
        StepTrace(0)
