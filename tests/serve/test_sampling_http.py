"""Penalties, min_p and logit_bias over HTTP (official ``openai`` client): passed through
to the engine unchanged (oracle: the offline ``LLM`` on the same weights)."""

from __future__ import annotations

import openai
import pytest
from serve_helpers import MODEL_NAME

from execstate import SamplingParams

PROMPT = [5, 9, 13, 17, 21, 25]


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def tokens(client, **kw) -> list[int]:
    extra = {"ignore_eos": True, "return_token_ids": True, **kw.pop("extra_body", {})}
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, extra_body=extra, **kw)
    return (r.choices[0].model_extra or {})["token_ids"]


@pytest.mark.parametrize(
    ("http_kw", "params"),
    [
        (dict(presence_penalty=1.5), dict(presence_penalty=1.5)),
        (dict(frequency_penalty=0.8), dict(frequency_penalty=0.8)),
        (dict(extra_body={"repetition_penalty": 1.4}), dict(repetition_penalty=1.4)),
        (dict(logit_bias={"7": 4.0, "100": -100}), dict(logit_bias={7: 4.0, 100: -100.0})),
        (dict(temperature=1.0, seed=4, extra_body={"min_p": 0.3}), dict(temperature=1.0, seed=4, min_p=0.3)),
    ],
    ids=["presence", "frequency", "repetition", "logit_bias", "min_p"],
)
def test_sampling_fields_pass_through(client, offline, http_kw: dict, params: dict) -> None:
    params = {"temperature": 0.0, **params}
    http_kw = {"temperature": 0.0, **http_kw}

    def offline_tokens(**kw) -> list[int]:
        p = SamplingParams(max_tokens=16, ignore_eos=True, **kw)
        return offline.generate({"prompt_token_ids": PROMPT}, p, use_tqdm=False)[0].outputs[0].token_ids

    ref = offline_tokens(**params)
    assert tokens(client, **http_kw) == ref
    plain = {k: v for k, v in params.items() if k in ("temperature", "seed")}
    assert ref != offline_tokens(**plain)  # the field has an effect here, so it did pass through


def test_logit_bias_plus_100_forces_the_token_when_streaming(client) -> None:
    stream = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=1.0, logit_bias={"42": 100}, stream=True,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ids = [t for chunk in stream for c in chunk.choices for t in (c.model_extra or {}).get("token_ids") or []]
    assert ids == [42] * 8
