"""Error statuses and OpenAI error bodies; API key; models and health; PD pass-through."""

from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient
from serve_helpers import MODEL_NAME, engine_config

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.app import build_app

KEY = "sk-test-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def http(served) -> TestClient:
    """The shared engine behind an app that requires an API key."""
    return TestClient(build_app(served.engine, MODEL_NAME, api_key=KEY, sessions=served.sessions))


def assert_error(r, status: int, param: str | None = None, contains: str = "", code: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert contains.lower() in err["message"].lower(), err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code


def cmpl(http: TestClient, **body):
    return http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": [5, 6, 7], **body}, headers=AUTH)


def chat(http: TestClient, **body):
    msgs = [{"role": "user", "content": "hi"}]
    return http.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": msgs, **body}, headers=AUTH)


def test_malformed_json_and_non_object_body(http):
    h = {**AUTH, "Content-Type": "application/json"}
    assert_error(http.post("/v1/completions", content=b'{"model": ', headers=h), 400, contains="malformed JSON")
    assert_error(http.post("/v1/completions", content=b"[1, 2]", headers=h), 400, contains="JSON object")
    assert_error(http.post("/v1/chat/completions", content=b"nope", headers=h), 400, contains="malformed JSON")


@pytest.mark.parametrize(
    ("body", "param", "contains"),
    [
        ({"temperature": -1}, "temperature", "temperature"),
        ({"top_p": 0}, "top_p", "top_p"),
        ({"top_p": 1.5}, "top_p", "top_p"),
        ({"max_tokens": 0}, "max_tokens", "max_tokens"),
        ({"n": 0}, "n", ">= 1"),
        ({"min_tokens": -1}, "min_tokens", "min_tokens"),
        ({"logprobs": 21}, "logprobs", "<= 20"),
        ({"logprobs": -1}, "logprobs", "logprobs"),
        ({"stop_token_ids": [-3]}, "stop_token_ids", "stop_token_ids"),
        ({"stop": [""]}, "stop", "stop"),
        ({"routed_experts_prompt_start": -1}, "routed_experts_prompt_start", "routed_experts_prompt_start"),
        ({"seed": 2**70}, "seed", "64 bits"),
        ({"temperature": "hot"}, "temperature", "number"),
        ({"max_tokens": 1.5}, "max_tokens", "integer"),
        ({"prompt_logprobs": 21}, "prompt_logprobs", "<= 20"),
        ({"prompt_logprobs": -1}, "prompt_logprobs", ">= 0"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "JSON Schema object"),
        ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        ({"structured_outputs": {"regex": "(?=a)a"}}, "structured_outputs", "look-around"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
        ({"structured_outputs": {"json": {"type": "object", "properties": {"a": {"enum": list(range(2000))}}}}},
         "structured_outputs", "enum has 2000 items"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs",
         "cannot be combined"),
        ({"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
        ({"frequency_penalty": -3}, "frequency_penalty", "[-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty", "> 0"),
        ({"min_p": 1.5}, "min_p", "[0, 1]"),
        ({"top_k": -2}, "top_k", "top_k"),
        ({"logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
        ({"logit_bias": {"512": 1}}, "logit_bias", "outside the vocabulary"),
        ({"logit_bias": {"512": 1}, "stream": True}, "logit_bias", "outside the vocabulary"),
        ({"prompt": [5, 512]}, "prompt", "outside the vocabulary"),
        ({"prompt": [5, -1]}, "prompt", "outside the vocabulary"),
        ({"prompt": []}, "prompt", "empty"),
        ({"prompt": [[5], [6, 99999]]}, "prompt", "outside the vocabulary"),
        ({"prompt": [7] * 256}, "prompt", "too long"),
        ({"prompt": [7] * 250, "max_tokens": 10}, "max_tokens", "maximum context length"),
        ({"prompt": {"a": 1}}, "prompt", "must be a string"),
        ({"prompt": [1, 2], "n": 2, "kv_transfer_params": {"x": 1}}, "kv_transfer_params", "n=1"),
        ({"prompt": [[1], [2]], "kv_transfer_params": {"x": 1}}, "kv_transfer_params", "one prompt"),
    ],
)
def test_completion_bad_parameters_are_400(http, body, param, contains):
    assert_error(cmpl(http, **body), 400, param=param, contains=contains)


@pytest.mark.parametrize(
    ("body", "param", "contains"),
    [
        ({"top_logprobs": 2}, "top_logprobs", "logprobs: true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "<= 20"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"content": "no role"}]}, "messages", "role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages", "text"),
        ({"tool_choice": "required"}, "tool_choice", "requires tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes"}, "tool_choice",
         "must be"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "not in tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools", "unique"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "tools", "JSON Schema"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "tool_choice", "cannot be combined"),
        ({"max_completion_tokens": 300}, "max_tokens", "maximum context length"),
    ],
)
def test_chat_bad_parameters_are_400(http, body, param, contains):
    assert_error(chat(http, **body), 400, param=param, contains=contains)


def test_unknown_model_is_404(http):
    r = http.post("/v1/completions", json={"model": "gpt-4", "prompt": "hi"}, headers=AUTH)
    assert_error(r, 404, param="model", contains="gpt-4", code="model_not_found")
    r = http.post(
        "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "a"}]}, headers=AUTH
    )
    assert_error(r, 404, code="model_not_found")
    assert_error(http.get("/v1/nothing-here", headers=AUTH), 404)


def test_api_key(http):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        assert_error(http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": [1]}, headers=headers),
                     401, code="invalid_api_key")
        assert_error(http.get("/v1/models", headers=headers), 401)
    assert http.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL_NAME
    assert http.get("/health").json() == {"status": "ok"}  # open, as in vLLM
    assert http.get("/metrics").status_code == 401  # open only with --public-metrics (test_keys_every_route.py)
    assert http.get("/metrics", headers=AUTH).status_code == 200


def test_no_422_ever(http):
    bodies = [{}, {"model": MODEL_NAME}, {"prompt": "x"}, {"model": 3, "prompt": None},
              {"model": MODEL_NAME, "prompt": [1], "n": "x"}, {"model": MODEL_NAME, "messages": "hi"}]
    for body in bodies:
        for path in ("/v1/completions", "/v1/chat/completions"):
            assert_error(http.post(path, json=body, headers=AUTH), 400)


def test_null_means_default(http):
    r = cmpl(http, temperature=None, n=None, max_tokens=3, top_p=None, ignore_eos=True)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_kv_transfer_params_pass_through(http, served):
    """The body's kv_transfer_params reach add_request; the output's come back top-level."""
    seen: list = []

    def install(e: LLMEngine) -> None:
        real = e.add_request

        def add_request(prompt, params=None, request_id=None, kv_transfer_params=None, scope=None):
            rid = real(prompt, params, request_id, kv_transfer_params, scope)
            seen.append(kv_transfer_params)
            e.requests[rid].transfer.out = {"remote_engine_id": "p0", "echo": kv_transfer_params}
            return rid

        e.add_request = add_request

    served.engine.call(install)
    try:
        kv = {"do_remote_decode": True, "transfer_id": "t-1"}
        r = cmpl(http, max_tokens=2, kv_transfer_params=kv)
        assert r.status_code == 200 and seen == [kv]
        assert r.json()["kv_transfer_params"] == {"remote_engine_id": "p0", "echo": kv}
        r = http.post("/v1/chat/completions", headers=AUTH, json={
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
            "kv_transfer_params": kv, "stream": True})
        last = [line for line in r.text.splitlines() if line.startswith("data: {")][-1]
        assert '"kv_transfer_params":{"remote_engine_id":"p0"' in last
        r = cmpl(http, max_tokens=2)
        assert r.json()["kv_transfer_params"]["echo"] is None and seen[-1] is None
    finally:
        served.engine.call(lambda e: e.__dict__.pop("add_request"))


def test_model_without_tokenizer_rejects_text(model_dir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    eng = AsyncEngine(LLMEngine(engine_config(bare)))
    try:
        client = TestClient(build_app(eng, "bare"))
        assert_error(client.post("/v1/completions", json={"model": "bare", "prompt": "hello"}), 400,
                     param="prompt", contains="no tokenizer")
        r = client.post("/v1/chat/completions", json={"model": "bare", "messages": [{"role": "user", "content": "a"}]})
        assert_error(r, 400, param="messages", contains="no tokenizer")
        r = client.post("/v1/completions", json={"model": "bare", "prompt": [5, 6], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == ""
    finally:
        eng.shutdown()
