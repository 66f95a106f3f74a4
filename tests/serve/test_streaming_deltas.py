"""Streams forward the engine's deltas: streamed chunks concatenate to the non-streamed
response (text, token ids, logprobs with their text offsets, finish and stop reasons,
usage), with seeded sampling over random bytes (split and invalid UTF-8) and a stop
string. Oracle: the same request without ``stream``."""

from __future__ import annotations

import openai
import pytest
from serve_helpers import MODEL_NAME

PROMPT = list(range(60, 90))


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def extra(obj, name: str):
    return (obj.model_extra or {}).get(name)  # extension fields are omitted when None


def a_stop_string(text: str) -> str:
    """Two characters first seen in the middle of ``text`` (no U+FFFD)."""
    at = next(i for i in range(len(text) // 3, len(text) - 2)
              if "\ufffd" not in text[i : i + 2] and text.find(text[i : i + 2]) == i)
    return text[at : at + 2]


@pytest.mark.parametrize("with_stop", [False, True])
def test_completion_stream_concatenates_to_the_non_streamed_response(client, with_stop):
    kw = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=30, temperature=1.0, seed=11, logprobs=2,
              extra_body={"ignore_eos": True, "return_token_ids": True})
    if with_stop:
        kw["stop"] = [a_stop_string(client.completions.create(**kw).choices[0].text)]
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    body = [ch.choices[0] for ch in chunks if ch.choices]
    assert len(body) > 1
    assert "".join(c.text for c in body) == whole.text
    assert sum((extra(c, "token_ids") for c in body), []) == extra(whole, "token_ids")
    assert extra(body[0], "prompt_token_ids") == PROMPT
    assert all(extra(c, "prompt_token_ids") is None for c in body[1:])
    lps = [c.logprobs for c in body]
    assert sum((lp.tokens for lp in lps), []) == whole.logprobs.tokens
    assert sum((lp.token_logprobs for lp in lps), []) == whole.logprobs.token_logprobs
    assert sum((lp.text_offset for lp in lps), []) == whole.logprobs.text_offset
    assert (body[-1].finish_reason, extra(body[-1], "stop_reason")) == (
        whole.finish_reason,
        extra(whole, "stop_reason"),
    )
    assert whole.finish_reason == ("stop" if with_stop else "length")
    if with_stop:
        assert kw["stop"][0] not in whole.text
    assert chunks[-1].usage.completion_tokens == len(extra(whole, "token_ids"))


def test_chat_stream_concatenates_to_the_non_streamed_response(client):
    kw = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "bytes please"}], max_completion_tokens=25,
              temperature=1.0, seed=5, logprobs=True, top_logprobs=2,
              extra_body={"ignore_eos": True, "return_token_ids": True})
    kw["stop"] = [a_stop_string(client.chat.completions.create(**kw).choices[0].message.content)]
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    body = [ch.choices[0] for ch in chunks if ch.choices]
    c = whole.choices[0]
    assert "".join(b.delta.content or "" for b in body) == c.message.content
    assert sum((extra(b, "token_ids") or [] for b in body), []) == extra(c, "token_ids")
    streamed_lps = [e for b in body if b.logprobs is not None for e in b.logprobs.content]
    assert [(e.token, e.logprob) for e in streamed_lps] == [(e.token, e.logprob) for e in c.logprobs.content]
    assert body[-1].finish_reason == c.finish_reason == "stop"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == len(extra(c, "token_ids"))
