"""/metrics series and their movement; a client that disconnects aborts its requests."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import MODEL_NAME, wait_idle

from execstate.engine.llm_engine import LLMEngine

NAMES = [
    "execstate_num_requests_running", "execstate_num_requests_waiting", "execstate_kv_blocks_used",
    "execstate_kv_blocks_total", "execstate_prefix_cache_hit_rate", "execstate_engine_healthy",
    "execstate_prompt_tokens_total", "execstate_generation_tokens_total", "execstate_kv_transfer_bytes_total",
    "execstate_kv_transfer_failures_total", "execstate_time_to_first_token_seconds_count",
    "execstate_inter_token_latency_seconds_count", "execstate_requests_finished_total",
]


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" not in s.labels:
                out[key] = s.value
    return out


def test_metrics_names_and_movement(served):
    before = scrape(served.url)
    for name in NAMES[:-1]:
        assert name in before, name
    r = httpx.post(served.url + "/v1/completions", json={
        "model": MODEL_NAME, "prompt": list(range(60, 90)), "max_tokens": 7, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    after = scrape(served.url)
    assert after["execstate_prompt_tokens_total"] - before["execstate_prompt_tokens_total"] == 30
    assert after["execstate_generation_tokens_total"] - before["execstate_generation_tokens_total"] == 7
    ttft = "execstate_time_to_first_token_seconds_count"
    itl = "execstate_inter_token_latency_seconds_count"
    assert after[ttft] - before[ttft] == 1 and after[itl] - before[itl] == 6
    assert after["execstate_time_to_first_token_seconds_sum"] > before["execstate_time_to_first_token_seconds_sum"]
    key = "execstate_requests_finished_total{finish_reason=length}"
    assert after[key] - before.get(key, 0.0) == 1
    total = served.engine.call(lambda e: e.block_pool.num_blocks)
    assert after["execstate_kv_blocks_total"] == total and after["execstate_kv_blocks_used"] == 0
    assert after["execstate_engine_healthy"] == 1.0
    assert after["execstate_num_requests_running"] == 0 and after["execstate_num_requests_waiting"] == 0


def test_record_transfer_moves_counters(served):
    metrics = served.app.state.ctx.metrics
    before = scrape(served.url)
    metrics.record_transfer(4096, ok=True)
    metrics.record_transfer(100, ok=False)
    after = scrape(served.url)
    assert after["execstate_kv_transfer_bytes_total"] - before["execstate_kv_transfer_bytes_total"] == 4196
    assert after["execstate_kv_transfer_failures_total"] - before["execstate_kv_transfer_failures_total"] == 1


@pytest.fixture
def abort_spy(served):
    aborted: list[str] = []

    def install(e: LLMEngine) -> None:
        real = e.abort_request

        def abort_request(request_id: str):
            out = real(request_id)
            if out is not None:
                aborted.append(request_id)
            return out

        e.abort_request = abort_request

    served.engine.call(install)
    yield aborted
    served.engine.call(lambda e: e.__dict__.pop("abort_request"))


@pytest.fixture
def slow_steps(served):
    """Each engine step takes >= 2 ms, so a 250-token request is still running when the
    client goes away (without it the tiny model can finish first on a fast machine)."""

    def install(e: LLMEngine) -> None:
        real = e.step

        def step():
            time.sleep(0.002)
            return real()

        e.step = step

    served.engine.call(install)
    yield
    served.engine.call(lambda e: e.__dict__.pop("step"))


LONG = {"model": MODEL_NAME, "prompt": [5, 6, 7, 8], "max_tokens": 250, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_stream_disconnect_aborts_and_frees_blocks(served, abort_spy, slow_steps, path):
    body = dict(LONG, stream=True, n=2)
    if path.endswith("chat/completions"):
        body = {k: v for k, v in body.items() if k != "prompt"} | {"messages": [{"role": "user", "content": "go"}],
                                                                    "max_tokens": 200}
    with httpx.Client(timeout=30) as client, client.stream("POST", served.url + path, json=body) as r:
        assert r.status_code == 200
        events = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events += 1
                if events == 4:
                    break  # leaving the block closes the connection mid-stream
    assert wait_idle(served.engine) == (0, 0, 0)
    assert len(abort_spy) == 2 and all(rid.endswith(("-0-0", "-0-1")) for rid in abort_spy)


def test_non_stream_disconnect_aborts_and_frees_blocks(served, abort_spy, slow_steps):
    with pytest.raises(httpx.ReadTimeout):
        timeout = httpx.Timeout(5.0, read=0.15)  # connect freely; give up while it generates
        httpx.post(served.url + "/v1/completions", json=dict(LONG, n=3), timeout=timeout)
    assert wait_idle(served.engine) == (0, 0, 0)
    assert len(abort_spy) == 3
