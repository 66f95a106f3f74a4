"""``echo`` with ``logprobs`` (and ``max_tokens`` 0 or more), vLLM's ``prompt_logprobs``: equal to
``LLM.score`` on the same tokens; ``/tokenize``, ``/detokenize``, ``/version``."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from serve_helpers import MODEL_NAME

PROMPT = [5, 17, 99, 3, 250, 41, 7, 300]


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("max_tokens", [0, 1, 3])
def test_echo_logprobs_equal_llm_score(client, offline, max_tokens):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=max_tokens, echo=True, logprobs=2,
                                  temperature=0, extra_body={"return_token_ids": True})
    c = r.choices[0]
    ref = offline.score(PROMPT)
    lp = c.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:len(PROMPT)] == ref.logprobs  # bit for bit: the same forward pass
    assert len(lp.tokens) == len(PROMPT) + max_tokens
    text = offline.get_tokenizer().decode(PROMPT, skip_special_tokens=False)
    assert c.text.startswith(text) and "".join(lp.tokens[:len(PROMPT)]) == text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for top, own in zip(lp.top_logprobs[1:len(PROMPT)], ref.logprobs, strict=True):
        assert len(top) <= 2 and max(top.values()) >= own
    if max_tokens == 0:
        assert c.finish_reason == "length" and r.usage.completion_tokens == 0 and c.text == text


def test_prompt_logprobs_vllm_layout(http, client, offline):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 3}
    c = http.post("/v1/completions", json=body).json()["choices"][0]
    plp = c["prompt_logprobs"]
    ref = offline.score(PROMPT).logprobs
    assert plp[0] is None and len(plp) == len(PROMPT)
    for i, entry in enumerate(plp[1:], start=1):
        own = entry[str(PROMPT[i])]
        assert own["logprob"] == ref[i - 1] and own["rank"] >= 1
        ranks = sorted(e["rank"] for t, e in entry.items() if t != str(PROMPT[i]) or e["rank"] <= 3)
        assert ranks[:3] == [1, 2, 3]
    chat = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "max_tokens": 1, "prompt_logprobs": 0,
                                                   "return_token_ids": True,
                                                   "messages": [{"role": "user", "content": "hello"}]}).json()
    ids = chat["prompt_token_ids"]
    assert [e[str(t)]["logprob"] for t, e in zip(ids[1:], chat["prompt_logprobs"][1:], strict=True)] == \
        offline.score(ids).logprobs
    # streamed: the first chunk carries the echo and its logprobs
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, echo=True, logprobs=1,
                                            stream=True))
    first = chunks[0].choices[0]
    assert first.logprobs.token_logprobs[1:len(PROMPT)] == ref


def test_chat_stream_prompt_logprobs(http, offline):
    """Streamed, the first chunk carries the prompt's logprobs (as the whole response does)."""
    body = {"model": MODEL_NAME, "max_tokens": 2, "prompt_logprobs": 0, "return_token_ids": True,
            "messages": [{"role": "user", "content": "hello"}]}
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    ids = chunks[0]["prompt_token_ids"]
    plp = chunks[0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    assert [e[str(t)]["logprob"] for t, e in zip(ids[1:], plp[1:], strict=True)] == offline.score(ids).logprobs
    assert all("prompt_logprobs" not in c for c in chunks[1:])


def test_max_tokens_zero_needs_echo_or_prompt_logprobs(http):
    r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_tokenize_detokenize_version(http, served):
    tok = served.engine.tokenizer
    r = http.post("/tokenize", json={"prompt": "hello world", "return_token_strs": True}).json()
    assert r["tokens"] == tok.encode("hello world") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == served.engine.max_model_len and len(r["token_strs"]) == r["count"]
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "hello world"}
    msgs = [{"role": "user", "content": "hi there"}]
    chat = http.post("/tokenize", json={"model": MODEL_NAME, "messages": msgs}).json()
    ref = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": msgs, "max_tokens": 1,
                                                  "return_token_ids": True}).json()
    assert chat["tokens"] == ref["prompt_token_ids"]
    assert http.post("/detokenize", json={"tokens": [10**6]}).status_code == 400
    assert http.post("/tokenize", json={"model": "other", "prompt": "x"}).status_code == 404
    assert http.post("/tokenize", json={}).status_code == 400
    assert isinstance(http.get("/version").json()["version"], str)
    info = http.get("/tokenizer_info").json()
    assert info["eos_token"] == tok.eos_token and info["chat_template"] == tok.chat_template
