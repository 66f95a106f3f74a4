"""HTTP ``cache_salt`` (vLLM's request field) on /v1/completions and /v1/chat/completions:
``usage.prompt_tokens_details.cached_tokens`` and ``prompt_token_sources`` never count another
tenant's prefix; a bad salt is a 400 naming ``cache_salt``. Offline text prompts carry it too."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from serve_helpers import MODEL_NAME

from execstate.engine.sampling_params import SamplingParams
from execstate.serve.app import build_app


@pytest.fixture(scope="module")
def http(served) -> TestClient:
    return TestClient(build_app(served.engine, MODEL_NAME, sessions=served.sessions))


def cached(r) -> int:
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_token_sources"]["local_cache"] == usage["prompt_tokens_details"]["cached_tokens"]
    return usage["prompt_tokens_details"]["cached_tokens"]


def cmpl(http: TestClient, prompt, salt=None, **body):
    extra = {} if salt is None else {"cache_salt": salt}
    return http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, **extra, **body})


def test_completions_tenants_do_not_see_each_other(http):
    ids = np.random.default_rng(11).integers(3, 500, 40).tolist()
    full = (40 - 1) // 16 * 16
    assert cached(cmpl(http, ids, "tenant-a")) == 0
    assert cached(cmpl(http, ids, "tenant-a")) == full
    assert cached(cmpl(http, ids, "tenant-b")) == 0
    assert cached(cmpl(http, ids)) == 0  # the unsalted tenant neither
    assert cached(cmpl(http, ids, "tenant-b")) == full


def test_streaming_usage_and_chat(http):
    ids = np.random.default_rng(12).integers(3, 500, 40).tolist()
    cmpl(http, ids, "stream-a")
    body = {"stream": True, "stream_options": {"include_usage": True}}
    lines = [ln[6:] for ln in cmpl(http, ids, "stream-b", **body).text.splitlines() if ln.startswith("data: {")]
    assert json.loads(lines[-1])["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    msgs = [{"role": "user", "content": "the same long question asked by two tenants " * 2}]

    def chat(salt):
        return http.post("/v1/chat/completions",
                         json={"model": MODEL_NAME, "messages": msgs, "max_tokens": 2, "cache_salt": salt})

    assert cached(chat("chat-a")) == 0
    assert cached(chat("chat-b")) == 0
    assert cached(chat("chat-a")) > 0


@pytest.mark.parametrize("salt", ["", "x" * 257, 7, ["a"]])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_salt_is_400_naming_cache_salt(http, path, salt):
    body = {"model": MODEL_NAME, "max_tokens": 2, "cache_salt": salt}
    body.update({"prompt": [5, 6, 7]} if "chat" not in path else {"messages": [{"role": "user", "content": "hi"}]})
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "cache_salt" and "cache_salt" in err["message"]


def test_lone_surrogate_salt_is_400(http):
    raw = b'{"model": "%s", "prompt": [5, 6], "max_tokens": 1, "cache_salt": "a\\ud800"}' % MODEL_NAME.encode()
    r = http.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
    assert http.get("/health").status_code == 200


def test_offline_text_prompt_with_salt(offline):
    text = "a text prompt shared by two tenants of one offline engine"
    params = SamplingParams(temperature=0.0, max_tokens=2)
    first = offline.generate({"prompt": text, "cache_salt": "text-a"}, params, use_tqdm=False)[0]
    again = offline.generate({"prompt": text, "cache_salt": "text-a"}, params, use_tqdm=False)[0]
    other = offline.generate({"prompt": text, "cache_salt": "text-b"}, params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and other.num_cached_tokens == 0
    assert again.num_cached_tokens > 0 and again.prompt == text
