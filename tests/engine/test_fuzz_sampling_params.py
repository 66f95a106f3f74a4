"""Property-based: offline, any SamplingParams is either served or a ValueError.

Hypothesis draws every field from valid, boundary and hostile values of the field's
type (NaN, infinities, huge and negative numbers, ids outside the vocabulary, empty and
unicode strings). Constructing the params and running ``LLM.generate`` must either
raise ``ValueError`` or serve every completion (stop or length, no error); nothing else
may escape, and the engine must stay consistent and keep giving the same greedy tokens.
(Values of the wrong Python type are a ``TypeError``, as Python APIs do; over HTTP they
are 400s, see tests/serve/test_fuzz_http.py.)
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execstate import LLM, SamplingParams

VOCAB = 512
PROMPT = {"prompt_token_ids": [5, 17, 42, 99]}
PROBE = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

huge = st.sampled_from([-(2**70), -(2**63), -1, 0, 2**63, 2**64, 2**70])
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 1e-40, 1e-6, 1.0, 1e308])
ids = st.lists(st.integers(-2, VOCAB + 2) | st.sampled_from([10**6, 2**63]), max_size=4)
params = st.fixed_dictionaries({}, optional={
    "n": st.integers(-1, 3),
    "temperature": floats,
    "top_p": floats,
    "top_k": st.none() | st.integers(-2, VOCAB + 2) | huge,
    "seed": st.none() | st.integers(-5, 5) | huge,
    "max_tokens": st.none() | st.integers(-1, 6) | huge,
    "min_tokens": st.integers(-1, 8) | huge,
    "stop": st.none() | st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3),
    "stop_token_ids": st.none() | ids,
    "ignore_eos": st.booleans(),
    "logprobs": st.none() | st.integers(-1, 6) | st.sampled_from([VOCAB, VOCAB + 1, 10**6]),
    "skip_special_tokens": st.booleans(),
    "routed_experts_prompt_start": st.integers(-1, 12) | huge,
})


@pytest.fixture(scope="module")
def llm(moe_dir) -> LLM:
    return LLM(str(moe_dir), seed=0, enable_return_routed_experts=True, max_model_len=16)


@pytest.fixture(scope="module")
def probe_tokens(llm) -> list[int]:
    return llm.generate(PROMPT, PROBE, use_tqdm=False)[0].outputs[0].token_ids


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kwargs=params)
def test_sampling_params_are_served_or_value_errors(llm, probe_tokens, kwargs):
    try:
        sp = SamplingParams(**kwargs)
        outs = llm.generate(PROMPT, sp, use_tqdm=False)
    except ValueError:
        outs = None
    if outs is not None:
        for out in outs:
            for c in out.outputs:
                assert c.finish_reason in ("stop", "length") and out.error is None, (kwargs, out.error)
                assert len(c.token_ids) >= 1
                if sp.logprobs is not None:
                    assert len(c.logprobs) == len(c.token_ids)
    eng = llm.engine
    assert not eng.has_unfinished_requests() and eng.block_pool.num_used == 0
    eng.check_integrity()
    assert llm.generate(PROMPT, PROBE, use_tqdm=False)[0].outputs[0].token_ids == probe_tokens
