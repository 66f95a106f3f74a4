"""The official ``openai`` client against a real uvicorn server: results equal ``LLM``'s.

Oracle: an offline ``LLM`` on the same weights (greedy, or seeded sampling), for token
ids, text, logprobs and R3 routes (base64 ``.npy`` decoded back to the array).
"""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from serve_helpers import MODEL_NAME

from execstate import SamplingParams

MESSAGES = [{"role": "system", "content": "you are terse"}, {"role": "user", "content": "name three colors"}]


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def npy(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


def extra(obj, name: str):
    """An extension field of an openai response object (kept as a pydantic extra)."""
    return (obj.model_extra or {})[name]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def test_completion_text_prompt_equals_offline(client, offline):
    prompt = "the quick brown fox jumps over"
    r = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ref = offline.generate(prompt, greedy(12, logprobs=2), use_tqdm=False)[0]
    c, rc = r.choices[0], ref.outputs[0]
    assert extra(c, "token_ids") == rc.token_ids and extra(c, "prompt_token_ids") == ref.prompt_token_ids
    assert c.text == rc.text and c.finish_reason == "length"
    ref_lps = [d[t].logprob for t, d in zip(rc.token_ids, rc.logprobs, strict=True)]
    assert c.logprobs.token_logprobs == pytest.approx(ref_lps, abs=1e-5)
    # keyed by token text (OpenAI's format), so tokens decoding alike share a key
    assert all(1 <= len(top) <= 3 for top in c.logprobs.top_logprobs)
    assert c.logprobs.tokens == [rc.logprobs[i][t].decoded_token for i, t in enumerate(rc.token_ids)]
    routes = npy(extra(c, "routed_experts"))
    assert routes.dtype == np.int16 and np.array_equal(routes, rc.routed_experts)
    assert routes.shape[0] == len(ref.prompt_token_ids) + 12 - 1
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (
        len(ref.prompt_token_ids),
        12,
        len(ref.prompt_token_ids) + 12,
    )
    assert u.prompt_tokens_details.cached_tokens == extra(u, "prompt_token_sources")["local_cache"]
    assert sum(extra(u, "prompt_token_sources").values()) == u.prompt_tokens


def test_completion_stream_deltas_concatenate_to_offline(client, offline):
    ids = list(range(40, 75))
    stream = client.completions.create(
        model=MODEL_NAME, prompt=ids, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    chunks = list(stream)
    ref = offline.generate({"prompt_token_ids": ids}, greedy(20), use_tqdm=False)[0].outputs[0]
    body = [ch for ch in chunks if ch.choices]
    assert len(body) > 1  # really streamed
    assert "".join(ch.choices[0].text for ch in body) == ref.text
    assert sum((extra(ch.choices[0], "token_ids") for ch in body), []) == ref.token_ids
    assert [ch.choices[0].finish_reason for ch in body][-1] == "length"
    assert all(ch.choices[0].finish_reason is None for ch in body[:-1])
    assert np.array_equal(npy(extra(body[-1].choices[0], "routed_experts")), ref.routed_experts)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == len(ids)


def test_chat_equals_offline_chat(client, offline):
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ref = offline.chat(MESSAGES, greedy(10, logprobs=3), use_tqdm=False)[0]
    c, rc = r.choices[0], ref.outputs[0]
    assert c.message.role == "assistant" and c.message.content == rc.text
    assert extra(c, "token_ids") == rc.token_ids and extra(r, "prompt_token_ids") == ref.prompt_token_ids
    assert [e.logprob for e in c.logprobs.content] == pytest.approx(
        [d[t].logprob for t, d in zip(rc.token_ids, rc.logprobs, strict=True)], abs=1e-5
    )
    assert all(len(e.top_logprobs) == 3 for e in c.logprobs.content)
    assert np.array_equal(npy(extra(c, "routed_experts")), rc.routed_experts)
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids) and r.usage.completion_tokens == 10


def test_chat_stream_equals_offline_chat(client, offline):
    messages = [{"role": "user", "content": [{"type": "text", "text": "stream "}, {"type": "text", "text": "this"}]}]
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=15, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))
    ref = offline.chat([{"role": "user", "content": "stream this"}], greedy(15), use_tqdm=False)[0].outputs[0]
    body = [ch for ch in chunks if ch.choices]
    assert body[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in body) == ref.text
    assert body[-1].choices[0].finish_reason == "length"
    assert np.array_equal(npy(extra(body[-1].choices[0], "routed_experts")), ref.routed_experts)
    assert chunks[-1].usage.completion_tokens == 15


def test_prefix_cache_hit_reports_cached_tokens_and_same_routes(client, offline):
    ids = list(range(100, 140))  # 40 tokens: 2 full blocks of 16 can be cached
    kw = dict(model=MODEL_NAME, prompt=ids, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    first = client.completions.create(**kw)
    second = client.completions.create(**kw)
    assert second.usage.prompt_tokens_details.cached_tokens == 32
    assert extra(second.usage, "prompt_token_sources") == {
        "local_cache": 32,
        "offloaded": 0,
        "transferred": 0,
        "computed": 8,
    }
    r1, r2 = npy(extra(first.choices[0], "routed_experts")), npy(extra(second.choices[0], "routed_experts"))
    assert r1.tobytes() == r2.tobytes()
    assert first.choices[0].text == second.choices[0].text


def test_routed_experts_prompt_start_omits_rows(client, offline):
    ids = list(range(200, 230))
    r = client.completions.create(
        model=MODEL_NAME, prompt=ids, max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True, "routed_experts_prompt_start": 20},
    )
    ref = offline.generate({"prompt_token_ids": ids}, greedy(5, routed_experts_prompt_start=20), use_tqdm=False)[0]
    routes = npy(extra(r.choices[0], "routed_experts"))
    assert routes.shape[0] == 30 + 5 - 1 - 20
    assert np.array_equal(routes, ref.outputs[0].routed_experts)


def test_n_and_list_of_prompts_follow_llm_seeds(client, offline):
    prompts = [[7, 8, 9, 10], [11, 12, 13]]
    r = client.completions.create(
        model=MODEL_NAME, prompt=prompts, n=2, max_tokens=6, temperature=1.0, seed=123,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    params = SamplingParams(n=2, temperature=1.0, seed=123, max_tokens=6, ignore_eos=True)
    refs = offline.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    expected = [c.token_ids for ref in refs for c in ref.outputs]
    assert [extra(c, "token_ids") for c in r.choices] == expected
    assert r.usage.prompt_tokens == 7 and r.usage.completion_tokens == 24


def test_stop_string_is_cut_and_reported(client, offline):
    ids = list(range(300, 320))
    ref = offline.generate({"prompt_token_ids": ids}, greedy(12), use_tqdm=False)[0].outputs[0]
    # a 2-character stop string first seen mid-text, made of whole characters
    at = next(i for i in range(1, len(ref.text) - 2)
              if "\ufffd" not in ref.text[i : i + 2] and ref.text.find(ref.text[i : i + 2]) == i)
    stop = ref.text[at : at + 2]
    kw = dict(model=MODEL_NAME, prompt=ids, max_tokens=12, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(stream=True, **kw) if ch.choices)
    cut = ref.text[: ref.text.find(stop)]
    assert (
        r.choices[0].text == cut and r.choices[0].finish_reason == "stop" and extra(r.choices[0], "stop_reason") == stop
    )
    assert streamed == cut


def test_models_endpoint(client, served):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert extra(models.data[0], "max_model_len") == served.engine.max_model_len
