"""Property-based: no request body, however hostile, gets a 5xx or changes what others get.

Hypothesis generates /v1/completions and /v1/chat/completions bodies from valid, boundary
and hostile values (huge, negative, NaN and infinite numbers, wrong types, huge n and
lists, ids outside the vocabulary, empty and unicode strings, nested junk, unknown
fields) and sends them to a real server on the tiny model. Each answer must be 200 or
4xx (an SSE stream must not carry a server error), /health must stay 200, and a fixed
greedy probe must return the same tokens before and after.
"""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_helpers import MODEL_NAME, VOCAB, wait_idle

PROBE = {"model": MODEL_NAME, "prompt": [5, 6, 7, 8, 9], "max_tokens": 8, "temperature": 0,
         "ignore_eos": True, "return_token_ids": True}
FUZZ = settings(max_examples=40, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

huge_ints = st.sampled_from([-(2**70), -(2**63), -1, 0, 2**31, 2**63, 2**64, 2**70, 10**30])
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 1e-40, 1e-6, 1e308, -0.0])
scalars = st.none() | st.booleans() | huge_ints | floats | st.text(max_size=12)
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                             max_size=3), max_leaves=8)
in_vocab = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)
any_ids = st.lists(st.integers(0, VOCAB - 1) | st.sampled_from([-1, VOCAB, 10**6, 2**63]), max_size=12)
text = st.text(min_size=1, max_size=40) | st.sampled_from(["\x00", "\ud7ff\ue000", "😀" * 20])
any_text = text | st.sampled_from(["", "a" * 2000])

# field: (valid values, hostile values); a body is either all valid (it must be served,
# 200) or a mix in which any field may be hostile or junk (200 or 4xx, never 5xx).
FIELDS = {
    "temperature": (st.floats(0, 2) | st.sampled_from([0, 1e-40]), floats),
    "top_p": (st.floats(0.01, 1), floats),
    "top_k": (st.integers(-1, 600), huge_ints),
    "seed": (st.integers(-(2**63), 2**64 - 1), huge_ints),
    "max_tokens": (st.integers(1, 6), st.sampled_from([None, 0, -1, 300, 2**70])),
    "min_tokens": (st.integers(0, 4), huge_ints),
    "n": (st.integers(1, 3), st.sampled_from([0, -1, 128, 129, 10**6])),
    "stop": (text | st.lists(st.text(min_size=1, max_size=8), max_size=4),
             any_text | st.lists(any_text, max_size=4) | st.lists(st.just("s"), min_size=17, max_size=20)),
    "stop_token_ids": (st.lists(st.integers(0, VOCAB - 1), max_size=4),
                       any_ids | st.lists(st.just(3), min_size=257, max_size=260)),
    "ignore_eos": (st.booleans(), junk),
    "stream": (st.booleans(), junk),
    "return_token_ids": (st.booleans(), junk),
    "routed_experts_prompt_start": (st.integers(0, 20), huge_ints),
    "frequency_penalty": (st.floats(-2, 2), floats),
    "presence_penalty": (st.floats(-2, 2), floats),
    "repetition_penalty": (st.floats(0.5, 2), floats),
    "min_p": (st.floats(0, 1), floats),
    "logit_bias": (st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-100, 100), max_size=3),
                   st.dictionaries(st.sampled_from(["5", "-1", "512", "x", " 7", "1e3"]), floats | junk, max_size=2)),
    "cache_salt": (st.text(min_size=1, max_size=16), any_text | st.sampled_from(["\ud800", "x" * 300]) | junk),
    "user": (text, junk),
    # unknown fields: accepted and ignored whatever they hold
    "store": (junk, junk), "metadata": (junk, junk), "service_tier": (junk, junk),
    "routed_experts_prompt_strat": (junk, junk), "model_dump": (junk, junk), "__class__": (junk, junk),
}
COMPLETION_FIELDS = {
    **FIELDS,
    "logprobs": (st.integers(0, 5), st.sampled_from([21, -1, 10**6])),
    "echo": (st.just(False), st.booleans()),
    "best_of": (st.none(), junk),
    "suffix": (st.none(), junk),
}
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),  # content: required
    "content": text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)})
hostile_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "tool"]) | junk}, optional={
    "content": any_text | st.lists(st.fixed_dictionaries({"type": st.just("text") | junk, "text": any_text}),
                                   max_size=2) | junk, "name": junk})
CHAT_FIELDS = {
    **FIELDS,
    "logprobs": (st.booleans(), junk),
    "max_completion_tokens": (st.integers(1, 6), huge_ints),
    "tools": (st.none(), junk),
    "tool_choice": (st.sampled_from(["none", "auto"]), junk),
    "response_format": (st.just({"type": "text"}), junk),
    "add_generation_prompt": (st.booleans(), junk),
}


def bodies(required: dict, fields: dict) -> st.SearchStrategy:
    valid = st.fixed_dictionaries({k: v for k, (v, _) in required.items()},
                                  optional={k: v for k, (v, _) in fields.items()})
    hostile = st.fixed_dictionaries({k: st.one_of(v, h, junk) for k, (v, h) in required.items()},
                                    optional={k: st.one_of(v, h, junk) for k, (v, h) in fields.items()})
    return st.one_of(valid, hostile)


completion_bodies = bodies(
    {"model": (st.just(MODEL_NAME), junk),
     "prompt": (text | in_vocab | st.lists(text | in_vocab, min_size=1, max_size=3),
                any_text | any_ids | st.lists(any_ids, max_size=3) | st.lists(st.just([1]), min_size=257,
                                                                              max_size=260))}, COMPLETION_FIELDS)
chat_bodies = bodies(
    {"model": (st.just(MODEL_NAME), junk),
     "messages": (st.lists(message, min_size=1, max_size=3), st.lists(hostile_message, max_size=3))}, CHAT_FIELDS)


STATUSES: Counter[tuple[str, int]] = Counter()  # (path, status) of every fuzzed request


def probe(url: str) -> list[int]:
    r = httpx.post(f"{url}/v1/completions", json=PROBE, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def check(url: str, path: str, body: dict) -> None:
    r = httpx.post(f"{url}{path}", content=json.dumps(body), timeout=120,
                   headers={"Content-Type": "application/json"})
    STATUSES[path, r.status_code] += 1
    server_errors = [] if r.status_code < 500 else [r.text[:300]]
    if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
        for line in r.text.splitlines():
            if line.startswith('data: {"error"') and json.loads(line[6:])["error"]["type"] == "server_error":
                server_errors.append(line[:300])
    assert not server_errors, (body, server_errors)
    assert r.status_code in (200, 400, 404, 413, 429), (r.status_code, r.text[:300])
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200


@pytest.fixture(scope="module")
def baseline(served):
    return probe(served.url)


@FUZZ
@given(body=completion_bodies)
def test_fuzz_completions(served, baseline, body):
    check(served.url, "/v1/completions", body)


@FUZZ
@given(body=chat_bodies)
def test_fuzz_chat_completions(served, baseline, body):
    check(served.url, "/v1/chat/completions", body)


def test_fuzzed_server_still_serves_the_same_tokens(served, baseline):
    print(dict(STATUSES))
    for path in ("/v1/completions", "/v1/chat/completions"):  # the bodies reached both outcomes
        assert STATUSES[path, 200] >= 3 and STATUSES[path, 400] >= 3, STATUSES
    assert wait_idle(served.engine, timeout=60) == (0, 0, 0)
    served.engine.call(lambda e: e.check_integrity())
    assert probe(served.url) == baseline
