"""Offline, every request-level problem is a ValueError before the engine sees it, and
the inputs that used to crash the engine thread leave it serving."""

from __future__ import annotations

import pytest

from execstate import LLM, SamplingParams

PROMPT = {"prompt_token_ids": [5, 17, 42, 99, 250]}
PROBE = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _set(params: SamplingParams, **fields) -> SamplingParams:
    """Params changed after construction (a caller mutating the dataclass): the engine's own
    checks must still refuse what ``SamplingParams`` refuses at construction."""
    for k, v in fields.items():
        setattr(params, k, v)
    return params


@pytest.fixture(scope="module")
def llm(moe_dir) -> LLM:
    return LLM(str(moe_dir), seed=0, enable_return_routed_experts=True)


@pytest.fixture(scope="module")
def probe_tokens(llm) -> list[int]:
    return llm.generate(PROMPT, PROBE, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize(
    ("params", "match"),
    [
        # min_tokens bans the stop ids, an id outside the vocabulary raised IndexError in the sampler
        (SamplingParams(min_tokens=3, stop_token_ids=[100000], max_tokens=4), r"stop_token_ids: 100000 is outside"),
        (SamplingParams(stop_token_ids=[5, 512]), r"stop_token_ids: 512 is outside the vocabulary \[0, 512\)"),
        (SamplingParams(logprobs=10**6), "logprobs: must be <= the vocabulary size 512"),
        (_set(SamplingParams(min_tokens=2), temperature=float("inf")), "temperature: must be finite"),
        (_set(SamplingParams(), seed=2**70), "seed: must fit in 64 bits"),
    ],
)
def test_bad_requests_are_value_errors_and_change_nothing(llm, probe_tokens, params, match):
    eng = llm.engine
    with pytest.raises(ValueError, match=match):
        llm.generate([PROMPT] * 3, params, use_tqdm=False)
    with pytest.raises(ValueError, match=match):
        eng.add_request(PROMPT, params, "direct")
    assert not eng.has_unfinished_requests() and eng.requests == {} and eng.block_pool.num_used == 0
    assert llm.generate(PROMPT, PROBE, use_tqdm=False)[0].outputs[0].token_ids == probe_tokens


def test_tiny_temperature_never_takes_the_engine_down(llm, probe_tokens):
    """temperature 1e-40 crashed the engine thread (inf logits -> NaN probabilities). The
    sampler treats temperature < 1e-5 as greedy (as vLLM does), so it is served greedily."""
    out = llm.generate(PROMPT, SamplingParams(temperature=1e-40, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert out[0].error is None and out[0].outputs[0].token_ids == probe_tokens
    llm.engine.check_integrity()
    assert llm.engine.block_pool.num_used == 0
    assert llm.generate(PROMPT, PROBE, use_tqdm=False)[0].outputs[0].token_ids == probe_tokens


def test_offline_batches_are_not_bounded_by_the_serving_queue(llm):
    """The waiting-queue bound (--max-waiting-requests, 256) is the server's: LLM.generate
    queues a larger batch itself."""
    prompts = [{"prompt_token_ids": [1 + i % 500, 2, 3]} for i in range(300)]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True), use_tqdm=False)
    assert len(outs) == 300 and all(len(o.outputs[0].token_ids) == 1 and o.error is None for o in outs)
    assert [o.prompt_token_ids[0] for o in outs] == [1 + i % 500 for i in range(300)]
