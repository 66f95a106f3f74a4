"""The deterministic mode of the torch path (``deterministic=True``: batch-invariant Triton
kernels) keeps R3 replay bitwise: scoring a rollout with its own routes gives its logprobs, compared
with ``==``, as the C kernels do on the CPU (tests/engine/test_bitwise_replay.py).

Run here through Triton's interpreter on the CPU (the same kernel code a GPU compiles): a batch of
greedy and seeded requests, a prefix hit, chunked prefill. The fast mode (Triton attention and MoE,
torch GEMMs) is checked against the torch path's fallback kernels (same tokens and routes).
Both are slow (the interpreter); the kernels' batch invariance is in the default set
(tests/gpu/test_paged_attention_triton.py, tests/gpu/test_triton_gemm_rows.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from execstate.engine.llm import LLM
from execstate.engine.sampling_params import SamplingParams
from execstate.kernels.family import triton_available
from execstate.model.random_models import make_random

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed (the gpu extra)")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_random("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"), seed=3)


def _rollout_logprobs(out) -> np.ndarray:
    return np.array([lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids, strict=True)], dtype=np.float64)


@pytest.mark.slow  # ~30 s of CPU: the whole model through Triton's interpreter
def test_score_equals_generation_bit_for_bit(moe_dir) -> None:
    llm = LLM(str(moe_dir), kernels="torch", gpu_kernels="triton", deterministic=True,
              enable_return_routed_experts=True, max_num_batched_tokens=24, seed=0)
    rng = np.random.default_rng(0)
    first = rng.integers(3, 500, 20).tolist()
    prompts = [first, rng.integers(3, 500, 9).tolist(), first + [7, 8, 9]]  # the third hits the first's prefix
    params = [SamplingParams(temperature=0.0 if seed is None else 0.9, seed=seed, max_tokens=5, ignore_eos=True,
                             logprobs=0) for seed in (None, 11, 12)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for p, o in zip(prompts, outs, strict=True):
        out = o.outputs[0]
        scored = llm.score(p + out.token_ids, routed_experts=out.routed_experts)
        got = np.array(scored.logprobs[len(p) - 1 :], dtype=np.float64)
        want = _rollout_logprobs(out)
        assert got.tobytes() == want.tobytes(), f"max |diff| {np.abs(got - want).max()}"
        np.testing.assert_array_equal(scored.routed_experts, out.routed_experts)


@pytest.mark.slow
def test_triton_path_matches_the_torch_fallback(moe_dir) -> None:
    prompt = np.random.default_rng(1).integers(3, 500, 18).tolist()
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = [LLM(str(moe_dir), kernels="torch", gpu_kernels=kind, enable_return_routed_experts=True).generate(
        {"prompt_token_ids": prompt}, greedy, use_tqdm=False)[0].outputs[0] for kind in ("triton", "torch")]
    assert outs[0].token_ids == outs[1].token_ids
    np.testing.assert_array_equal(outs[0].routed_experts, outs[1].routed_experts)


def test_deterministic_without_triton_is_refused(moe_dir) -> None:
    with pytest.raises(ValueError, match="deterministic=True needs the Triton kernels"):
        LLM(str(moe_dir), kernels="torch", gpu_kernels="torch", deterministic=True)
