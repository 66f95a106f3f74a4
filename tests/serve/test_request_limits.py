"""Request limits over HTTP: the issue's hostile inputs, body size (413), per-field bounds
(400), unknown fields (accepted, named in X-Ignored-Fields), the serve options."""

from __future__ import annotations

import json
import logging
import socket
from urllib.parse import urlparse

import httpx
import pytest
from fastapi.testclient import TestClient
from serve_helpers import MODEL_NAME, running_server, wait_idle

from execstate.cli import _ENGINE_DEFAULTS, build_parser
from execstate.engine.config import EngineConfig
from execstate.serve.app import build_app
from execstate.serve.limits import ServingLimits, parse_size
from execstate.serve.server import engine_config_from_args, limits_from_args

PROBE = {"model": MODEL_NAME, "prompt": [5, 6, 7, 8, 9], "max_tokens": 8, "temperature": 0,
         "ignore_eos": True, "return_token_ids": True}


def post(url: str, body: dict, **kw) -> httpx.Response:
    """POST ``body`` as Python's json writes it (NaN and Infinity included, as a hostile client may)."""
    return httpx.post(url, content=json.dumps(body), headers={"Content-Type": "application/json"}, timeout=60, **kw)


def probe(url: str) -> list[int]:
    r = httpx.post(f"{url}/v1/completions", json=PROBE, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text[:500]
    return r.json()["error"]


@pytest.mark.parametrize(
    ("body", "status", "param", "contains"),
    [
        ({"min_tokens": 5, "stop_token_ids": [100000]}, 400, "stop_token_ids", "outside the vocabulary"),
        ({"n": 1000000}, 400, "n", "--max-n"),
        ({"prompt": [[1, 2]] * 100_000}, 400, "prompt", "--max-prompts-per-request"),
        ({"prompt": ["a"] * 100_000}, 400, "prompt", "--max-prompts-per-request"),
        ({"prompt": "x" * 5_000_000}, 413, None, "--max-request-bytes"),
        ({"temperature": float("inf"), "min_tokens": 2}, 400, "temperature", "finite"),
        ({"logprobs": 21}, 400, "logprobs", "<= 20 (--max-logprobs)"),
        ({"stop": ["s"] * 17}, 400, "stop", "--max-stop-strings"),
        ({"stop": ["s" * 257]}, 400, "stop", "--max-stop-string-length"),
        ({"stop_token_ids": [3] * 257}, 400, "stop_token_ids", "--max-stop-token-ids"),
        ({"prompt": "hello " * 400}, 400, "prompt", "too long"),
    ],
)
def test_hostile_completion_inputs_are_refused_and_the_engine_serves(served, body, status, param, contains):
    before = probe(served.url)
    r = post(f"{served.url}/v1/completions", {**PROBE, **body})
    err = error_of(r, status)
    assert contains in err["message"] and err["param"] == param
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}
    assert probe(served.url) == before
    assert wait_idle(served.engine) == (0, 0, 0)


def test_chat_limits(served):
    base = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{served.url}/v1/chat/completions", json={**base, "logprobs": True, "top_logprobs": 21})
    assert "--max-logprobs" in error_of(r, 400)["message"]
    r = httpx.post(f"{served.url}/v1/chat/completions", json={**base, "n": 129})
    assert error_of(r, 400)["param"] == "n"
    big = {**base, "messages": [{"role": "user", "content": "hello " * 400}]}
    assert "too long" in error_of(httpx.post(f"{served.url}/v1/chat/completions", json=big), 400)["message"]


def test_tiny_temperature_never_takes_the_server_down(served):
    """temperature 1e-40 used to crash the engine thread; the sampler serves it greedily (as vLLM does)."""
    before = probe(served.url)
    r = httpx.post(f"{served.url}/v1/completions", json={**PROBE, "temperature": 1e-40}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == before
    assert httpx.get(f"{served.url}/health").status_code == 200
    assert probe(served.url) == before


@pytest.fixture(scope="module")
def small_body_server(served):
    app = build_app(served.engine, MODEL_NAME, limits=ServingLimits(max_request_bytes=1000), sessions=served.sessions)
    with running_server(app) as (url, _):
        yield url


def test_body_over_the_limit_by_content_length_is_413_before_reading_it(small_body_server):
    host, port = urlparse(small_body_server).hostname, urlparse(small_body_server).port
    with socket.create_connection((host, port), timeout=10) as s:
        # Announce 10 MB and send none of it: the answer must come without the body.
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000000\r\n\r\n")
        answer = b""
        while b"}}" not in answer:  # the error body ends the answer
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
    text = answer.decode("latin-1")
    assert text.startswith("HTTP/1.1 413"), text[:200]
    assert "request_too_large" in text and "(10000000 bytes)" in text and "--max-request-bytes" in text


def test_chunked_body_over_the_limit_is_413(small_body_server):
    def chunks():
        yield b'{"model": "' + MODEL_NAME.encode() + b'", "prompt": "'
        for _ in range(100):
            yield b"x" * 100
        yield b'"}'

    r = httpx.post(f"{small_body_server}/v1/completions", content=chunks(),
                   headers={"Content-Type": "application/json"})
    assert error_of(r, 413)["code"] == "request_too_large"
    small = {**PROBE, "prompt": "hello"}
    r = httpx.post(f"{small_body_server}/v1/completions",
                   content=iter([httpx.Request("POST", "/", json=small).content]),
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text  # a chunked body under the limit is served


def test_unknown_fields_are_ignored_and_named(served, caplog):
    body = {**PROBE, "store": True, "metadata": {"k": "v"}, "service_tier": "auto",
            "routed_experts_prompt_strat": 3, "é": 1, "stream_options": None}
    with caplog.at_level(logging.INFO, logger="execstate.serve.app"):
        r = httpx.post(f"{served.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == probe(served.url)
    assert r.headers["x-ignored-fields"].split(",") == [
        "store", "metadata", "service_tier", "routed_experts_prompt_strat", "%C3%A9"]
    assert "routed_experts_prompt_strat" in caplog.text
    assert "x-ignored-fields" not in httpx.post(f"{served.url}/v1/completions", json=PROBE).headers
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "user": "u1", "parallel_tool_calls": False, "store": False, "stream": True,
            "stream_options": {"include_usage": True, "include_obfuscation": False}}
    r = httpx.post(f"{served.url}/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert r.headers["x-ignored-fields"] == "store,stream_options.include_obfuscation"
    r = httpx.post(f"{served.url}/v1/completions", json={**PROBE, **{f"f{i}": i for i in range(40)}}, timeout=60)
    listed = r.headers["x-ignored-fields"].split(",")
    assert listed == [f"f{i}" for i in range(32)] + ["+8-more"]


def test_cli_defaults_are_the_documented_ones(tmp_path):
    args = build_parser().parse_args(["serve", "m"])
    assert limits_from_args(args) == ServingLimits()
    cfg, engine_defaults = engine_config_from_args(args), EngineConfig(model="m")
    assert {"max_num_seqs": engine_defaults.max_num_seqs,
                                "max_num_batched_tokens": engine_defaults.max_num_batched_tokens,
                                "kv_cache_memory": engine_defaults.kv_cache_memory_bytes,
                                "prompt_logprobs_chunk_tokens": engine_defaults.prompt_logprobs_chunk_tokens} == \
        _ENGINE_DEFAULTS
    assert cfg.prompt_logprobs_chunk_tokens == engine_defaults.prompt_logprobs_chunk_tokens
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.kv_cache_memory_bytes, cfg.num_kv_blocks) == (
        64, 2048, 1 << 30, None)
    args = build_parser().parse_args(["serve", "m", "--max-num-seqs", "8", "--kv-cache-memory", "2GiB",
                                      "--max-request-bytes", "1MiB", "--max-n", "4", "--num-kv-blocks", "100",
                                      "--max-waiting-requests", "7"])
    cfg, limits = engine_config_from_args(args), limits_from_args(args)
    assert (cfg.max_num_seqs, cfg.kv_cache_memory_bytes, cfg.num_kv_blocks) == (8, 2 << 30, 100)
    assert (limits.max_request_bytes, limits.max_n, limits.max_waiting_requests) == (1 << 20, 4, 7)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--kv-cache-memory", "lots"])


def test_parse_size_and_limit_validation():
    assert [parse_size(s) for s in ("1024", "4MiB", "2 GiB", "1.5GB")] == [1024, 4 << 20, 2 << 30, 1_500_000_000]
    for bad in ("x", "-5", "1e3"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)
    with pytest.raises(ValueError, match="max_n must be an integer >= 1"):
        ServingLimits(max_n=0)
    assert ServingLimits(max_logprobs=0).max_logprobs == 0


def test_testclient_app_without_limits_uses_defaults(served):
    client = TestClient(build_app(served.engine, MODEL_NAME, sessions=served.sessions))
    r = client.post("/v1/completions", json={**PROBE, "n": 129})
    assert r.status_code == 400 and "--max-n" in r.json()["error"]["message"]
