"""Which completions carry ``routed_experts`` (R3 over HTTP).

- ``--enable-return-routed-experts`` (vLLM's behaviour): every choice carries its routes; a request's
  ``"return_routed_experts": false`` (SGLang's request field) leaves them out.
- ``--routed-experts-on-request`` (what ``execstate serve`` with no MODEL does): the engine records
  the routes, a choice carries them only when its request asks (``"return_routed_experts": true``).
- A server that records no routes answers a request that asks with a 400 naming the field.

Oracle: an offline ``LLM`` on the same weights (greedy) for the routes returned.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from serve_helpers import MODEL_NAME, engine_config

from execstate import SamplingParams
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.app import build_app

PROMPT = [5, 17, 23, 42, 8, 99, 3]
MESSAGES = [{"role": "user", "content": "name three colors"}]


def _npy(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


@pytest.fixture(scope="module")
def on_request(served) -> TestClient:
    """The served engine behind a second app that returns routes on request only."""
    return TestClient(build_app(served.engine, MODEL_NAME, sessions=served.sessions, routes_on_request=True))


@pytest.fixture(scope="module")
def every(served) -> TestClient:
    return TestClient(served.app)


@pytest.fixture(scope="module")
def reference(offline) -> np.ndarray:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return offline.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)[0].outputs[0].routed_experts


def _completion(client: TestClient, **extra) -> dict:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True, **extra}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_on_request_server_returns_routes_only_when_asked(on_request, reference) -> None:
    assert "routed_experts" not in _completion(on_request)
    assert "routed_experts" not in _completion(on_request, return_routed_experts=False)
    asked = _npy(_completion(on_request, return_routed_experts=True)["routed_experts"])
    assert asked.dtype == np.int16 and np.array_equal(asked, reference)
    assert asked.shape[0] == len(PROMPT) + 6 - 1


def test_on_request_chat_and_streams(on_request) -> None:
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    plain = on_request.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert "routed_experts" not in plain
    asked = on_request.post("/v1/chat/completions", json={**body, "return_routed_experts": True}).json()
    routes = _npy(asked["choices"][0]["routed_experts"])
    assert routes.shape[0] == asked["usage"]["prompt_tokens"] + 4 - 1
    for path, req in (("/v1/chat/completions", body),
                      ("/v1/completions", {k: v for k, v in body.items() if k != "messages"} | {"prompt": PROMPT})):
        for ask in (None, True):
            chunks = _sse(on_request, path, {**req, "stream": True} | ({} if ask is None else
                                                                     {"return_routed_experts": ask}))
            with_routes = [c for c in chunks if c["choices"] and "routed_experts" in c["choices"][0]]
            assert len(with_routes) == (1 if ask else 0), (path, ask)
            if ask:
                assert with_routes[0]["choices"][0]["finish_reason"] == "length"


def _sse(client: TestClient, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_every_answer_carries_routes_unless_it_opts_out(every, reference) -> None:
    """vLLM's ``--enable-return-routed-experts``: routes with every answer, as before."""
    assert np.array_equal(_npy(_completion(every)["routed_experts"]), reference)
    assert np.array_equal(_npy(_completion(every, return_routed_experts=True)["routed_experts"]), reference)
    assert "routed_experts" not in _completion(every, return_routed_experts=False)


def test_asking_a_server_without_routes_is_a_400(model_dir) -> None:
    engine = AsyncEngine(LLMEngine(engine_config(model_dir, enable_return_routed_experts=False)))
    try:
        client = TestClient(build_app(engine, MODEL_NAME))
        assert "routed_experts" not in _completion(client)
        for path, body in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": MESSAGES})):
            r = client.post(path, json={"model": MODEL_NAME, "max_tokens": 2, "return_routed_experts": True, **body})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "return_routed_experts" and "--enable-return-routed-experts" in err["message"]
            assert engine.call(lambda e: e.block_pool.num_used) == 0  # refused before any engine work
    finally:
        engine.shutdown()
