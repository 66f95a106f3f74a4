"""Over HTTP: a failing step is a 500 (or an in-band SSE error) for its requests only; a
failure that corrupts shared state makes /health 503 and the server exit non-zero; the
bounded waiting queue answers 429 with Retry-After before the engine sees the request.

Faults are injected by test doubles installed on the engine thread (``engine.call``).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from serve_helpers import MODEL_NAME, engine_config, free_port, running_server, wait_idle

from execstate import SamplingParams
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.app import build_app
from execstate.serve.server import serve_until_engine_dies

A = [5, 17, 42, 99, 250, 311, 7, 8, 9, 10]
B = [21, 22, 23, 24, 25, 26]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def body(prompt: list[int], **kw) -> dict:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, **kw}


def fail_when(engine: AsyncEngine, predicate, corrupt: bool = False) -> None:
    """Make the runner raise once, for the first step whose batch satisfies ``predicate``."""

    def install(e: LLMEngine) -> None:
        real = e.runner.execute
        fired = []

        def execute(sched):
            if not fired and predicate(sched):
                fired.append(True)
                if corrupt:  # a leaked block reference: shared state no longer adds up
                    e.block_pool._blocks[sched.scheduled[0].request.block_ids[0]].ref_count += 1
                raise RuntimeError("injected step fault")
            return real(sched)

        e.runner.execute = execute

    engine.call(install)


def decoding(prompt: list[int], after: int):
    return lambda sched: any(s.request.prompt_token_ids == prompt and len(s.request.output_token_ids) >= after
                             for s in sched.scheduled)


@pytest.fixture
def one_seq_engine(model_dir):
    eng = AsyncEngine(LLMEngine(engine_config(model_dir, max_num_seqs=1)), max_waiting_requests=2)
    yield eng
    eng.shutdown()


def reference(offline, prompt: list[int]) -> list[int]:
    return offline.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_failed_step_is_a_500_for_its_request_only(one_seq_engine, offline):
    fail_when(one_seq_engine, decoding(A, 3))
    client = TestClient(build_app(one_seq_engine, MODEL_NAME))
    with ThreadPoolExecutor(2) as pool:  # "a" runs (max_num_seqs=1) while "b" waits
        ra = pool.submit(client.post, "/v1/completions", json=body(A))
        time.sleep(0.2)
        rb = pool.submit(client.post, "/v1/completions", json=body(B))
        ra, rb = ra.result(60), rb.result(60)
    assert ra.status_code == 500, ra.text
    err = ra.json()["error"]
    assert err["code"] == "request_failed" and "injected step fault" in err["message"]
    assert rb.status_code == 200 and rb.json()["choices"][0]["token_ids"] == reference(offline, B)
    assert client.get("/health").json() == {"status": "ok"}
    r = client.post("/v1/completions", json=body(A))  # the probe: the same tokens as ever
    assert r.json()["choices"][0]["token_ids"] == reference(offline, A)
    assert wait_idle(one_seq_engine) == (0, 0, 0)
    one_seq_engine.call(lambda e: e.check_integrity())


def test_failed_step_mid_stream_is_an_in_band_error(one_seq_engine, offline):
    fail_when(one_seq_engine, decoding(A, 4))
    client = TestClient(build_app(one_seq_engine, MODEL_NAME))
    r = client.post("/v1/completions", json=body(A, stream=True))
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "request_failed" and err["type"] == "server_error"
    streamed = [t for e in events[:-2] for t in json.loads(e)["choices"][0]["token_ids"]]
    assert streamed == reference(offline, A)[: len(streamed)] and len(streamed) >= 4
    assert client.get("/health").status_code == 200
    r = client.post("/v1/completions", json=body(A))
    assert r.json()["choices"][0]["token_ids"] == reference(offline, A)


def test_corrupting_failure_stops_the_engine_and_the_server_exits_non_zero(model_dir):
    eng = AsyncEngine(LLMEngine(engine_config(model_dir)))
    app = build_app(eng, MODEL_NAME)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(serve_until_engine_dies(server, eng)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        url = f"http://127.0.0.1:{server.config.port}"
        assert httpx.get(f"{url}/health").status_code == 200
        fail_when(eng, decoding(A, 2), corrupt=True)
        r = httpx.post(f"{url}/v1/completions", json=body(A), timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        health = TestClient(app).get("/health")
        assert health.status_code == 503 and "inconsistent" in health.json()["error"]
        thread.join(20)
        assert status == [1]
    finally:
        server.should_exit = True
        thread.join(10)
        eng.shutdown()


def test_full_waiting_queue_is_429_before_the_engine_sees_the_request(one_seq_engine):
    added: list[str] = []

    def spy(e: LLMEngine) -> None:
        real = e.add_request
        e.add_request = lambda *a, **kw: (added.append(a[2] if len(a) > 2 else kw["request_id"]), real(*a, **kw))[1]

    def slow(e: LLMEngine) -> None:  # the tiny model would finish the running request too soon
        real = e.runner.execute
        e.runner.execute = lambda sched: (time.sleep(0.03), real(sched))[1]

    one_seq_engine.call(spy)
    one_seq_engine.call(slow)
    long = {**body(A, stream=True), "max_tokens": 200}
    with running_server(build_app(one_seq_engine, MODEL_NAME)) as (url, _), httpx.Client(timeout=60) as c:
        with c.stream("POST", f"{url}/v1/completions", json=long) as running:
            lines = running.iter_lines()  # kept: a collected iterator would close the connection
            next(line for line in lines if line.startswith("data: "))  # running now
            with c.stream("POST", f"{url}/v1/completions", json=long), \
                 c.stream("POST", f"{url}/v1/completions", json={**long, "prompt": B}):  # two waiting
                deadline = time.monotonic() + 10
                while len(added) < 3:  # both reached the engine
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                r = c.post(f"{url}/v1/completions", json=body(B))
                assert r.status_code == 429 and r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "rate_limit_exceeded" and "limit 2" in r.json()["error"]["message"]
                time.sleep(0.1)
                assert len(added) == 3  # the refused request never reached the engine thread
                r = c.post(f"{url}/v1/chat/completions",
                           json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]})
                assert r.status_code == 429
        r = c.post(f"{url}/v1/completions", json=body(B, n=4))  # > 2 waiting + 1 running: can never fit
        assert r.status_code == 400 and "--max-waiting-requests" in r.json()["error"]["message"]
        assert wait_idle(one_seq_engine) == (0, 0, 0)
        one_seq_engine.call(lambda e: None)  # the engine thread has published its waiting queue
        r = c.post(f"{url}/v1/completions", json=body(B, n=2))  # every slot was given back
        assert r.status_code == 200 and len(r.json()["choices"]) == 2
