"""RequestTimer turns DELTA and FINAL_ONLY outputs into TTFT/ITL samples (no server)."""

from __future__ import annotations

import pytest

from execstate.engine.outputs import CompletionOutput, RequestOutput
from execstate.serve.metrics import ServingMetrics


def output(n_tokens: int, finished: bool, first_token_time: float | None = None) -> RequestOutput:
    c = CompletionOutput(0, "", list(range(n_tokens)), None, None, "length" if finished else None)
    metrics = {} if first_token_time is None else {"first_token_time": first_token_time}
    return RequestOutput("r", None, [1, 2, 3], [c], finished, metrics=metrics)


def sample(m: ServingMetrics, name: str) -> float:
    value = m.registry.get_sample_value(name)
    return 0.0 if value is None else value


@pytest.fixture
def m() -> ServingMetrics:
    return ServingMetrics()


def test_delta_outputs(m):
    t = m.timer(arrival=10.0)
    t.on_output(output(1, False, first_token_time=10.4), now=10.5)  # one token: the delivery time counts
    t.on_output(output(1, False), now=10.75)
    t.on_output(output(2, True), now=11.25)  # two tokens at once: two gaps of 0.25
    assert sample(m, "execstate_time_to_first_token_seconds_sum") == pytest.approx(0.5)
    assert sample(m, "execstate_inter_token_latency_seconds_count") == 3
    assert sample(m, "execstate_inter_token_latency_seconds_sum") == pytest.approx(0.75)
    assert sample(m, "execstate_generation_tokens_total") == 4
    assert sample(m, "execstate_prompt_tokens_total") == 3


def test_final_only_output_uses_the_engine_first_token_time(m):
    t = m.timer(arrival=10.0)
    t.on_output(output(5, True, first_token_time=10.2), now=11.0)
    assert sample(m, "execstate_time_to_first_token_seconds_sum") == pytest.approx(0.2)
    assert sample(m, "execstate_inter_token_latency_seconds_count") == 4
    assert sample(m, "execstate_inter_token_latency_seconds_sum") == pytest.approx(0.8)
    assert sample(m, "execstate_generation_tokens_total") == 5
    assert m.registry.get_sample_value("execstate_requests_finished_total", {"finish_reason": "length"}) == 1
