"""Bitwise replay: scoring a generated sequence (``LLM.score`` with its routes) gives the
rollout's logprobs exactly, compared with ``==``, in every numerics mode on the CPU kernels.

Why it holds: every kernel computes a row with the same operations whatever the rows around
it (the linears, the MoE block, RMSNorm, RoPE, SwiGLU, the shared-expert gate, attention on
the block tables), and the scorer's attention runs the engine's paged kernel over the
sequence's own K/V (``model/replay_attention.py``). So the token-by-token decode of a
generation and the one-pass prefill of the scorer give each row the same bits.

Drawn by hypothesis: prompt lengths, batch mixes (several requests per step, greedy and
seeded sampling), prompts that continue earlier ones (prefix-cache hits), chunked prefill
(a small token budget); and separately a PD pair (the decode side's KV loaded from the
prefill side).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execstate.engine.sampling_params import SamplingParams
from execstate.kernels import cpu
from execstate.kernels.weight_format import WeightFormat
from execstate.model.gguf_quantize import quantize_checkpoint
from execstate.model.random_models import make_random
from execstate.session.lm.llm import LLM

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

# (architecture, engine kwargs): every numerics mode on the kernels, MoE and dense families.
MODES = {
    "qwen3_moe-fp32": ("qwen3_moe", {}),
    "qwen3_moe-bf16w": ("qwen3_moe", {"dtype": "bfloat16"}),
    "qwen2_moe-fp32-chunked": ("qwen2_moe", {"max_num_batched_tokens": 24}),
    "llama-bf16w": ("llama", {"dtype": "bfloat16"}),
    "qwen2_moe-bf16": ("qwen2_moe", {"dtype": "bfloat16", "compute_dtype": "bfloat16"}),
    "mixtral-bf16-chunked": ("mixtral", {"dtype": "bfloat16", "compute_dtype": "bfloat16",
                                         "max_num_batched_tokens": 20}),
    "qwen3_moe-q4_1": ("qwen3_moe", {"quantization": "gguf"}),
    "llama-q8_0-chunked": ("llama", {"quantization": "gguf", "max_num_batched_tokens": 24}),
    # bf16 attention (bf16 K/V) over fp32 and over bf16 arithmetic
    "qwen3_moe-fp32-kvbf16-chunked": ("qwen3_moe", {"kv_cache_dtype": "bfloat16", "max_num_batched_tokens": 24}),
    "llama-bf16-kvbf16": ("llama", {"dtype": "bfloat16", "compute_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}),
}
# the GGUF block format of a mode's build (model/gguf_quantize.py), by mode name
GGUF_FORMAT = {"qwen3_moe-q4_1": WeightFormat.Q4_1, "llama-q8_0-chunked": WeightFormat.Q8_0}


@pytest.fixture(scope="module", params=sorted(MODES))
def engine(request, tmp_path_factory) -> LLM:
    arch, kwargs = MODES[request.param]
    model_dir = make_random(arch, tmp_path_factory.mktemp(arch), seed=3)
    if request.param in GGUF_FORMAT:
        quantize_checkpoint(model_dir, model_dir.with_name(f"{model_dir.name}-gguf"), GGUF_FORMAT[request.param],
                            WeightFormat.Q8_0)
        model_dir = model_dir.with_name(f"{model_dir.name}-gguf")
    return LLM(str(model_dir), enable_return_routed_experts=True, seed=0, **kwargs)


def rollout_logprobs(out) -> np.ndarray:
    return np.array([lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids, strict=True)], dtype=np.float64)


def assert_replays(llm: LLM, prompt: list[int], out) -> None:
    """``score(prompt + generated, routes)`` equals the rollout: logprobs bit for bit, routes."""
    scored = llm.score(prompt + out.token_ids, routed_experts=out.routed_experts)
    got = np.array(scored.logprobs[len(prompt) - 1:], dtype=np.float64)
    want = rollout_logprobs(out)
    assert got.tobytes() == want.tobytes(), f"max |diff| {np.abs(got - want).max()}"
    if out.routed_experts is not None:
        np.testing.assert_array_equal(scored.routed_experts, out.routed_experts)


request_st = st.tuples(
    st.integers(1, 40),  # new prompt tokens
    st.booleans(),  # continue an earlier prompt (prefix hit)
    st.one_of(st.none(), st.integers(0, 2**16)),  # None: greedy, else the sampling seed
    st.integers(1, 12),  # max_tokens
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(request_st, min_size=1, max_size=4), salt=st.integers(0, 2**16))
def test_score_equals_generation_bit_for_bit(engine: LLM, requests, salt: int) -> None:
    rng = np.random.default_rng(salt)
    history = getattr(engine, "_replay_history", [])
    prompts, params = [], []
    for new, continue_earlier, seed, max_tokens in requests:
        base = history[int(rng.integers(len(history)))] if continue_earlier and history else []
        prompts.append(base + rng.integers(3, 500, new).tolist())
        params.append(SamplingParams(temperature=0.0 if seed is None else 0.9, seed=seed, max_tokens=max_tokens,
                                     ignore_eos=True, logprobs=0))
    outs = engine.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for p, o in zip(prompts, outs, strict=True):
        assert_replays(engine, p, o.outputs[0])
        history.append(p + o.outputs[0].token_ids)
    engine._replay_history = history[-16:]


def test_prefix_hits_happen(tmp_path) -> None:
    """The prefix-hit draws above do reach the cache (a sanity check of the strategy)."""
    llm = LLM(str(make_random("qwen3_moe", tmp_path, seed=3)), enable_return_routed_experts=True)
    first = np.random.default_rng(0).integers(3, 500, 40).tolist()
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0)
    a = llm.generate({"prompt_token_ids": first}, greedy, use_tqdm=False)[0]
    b_prompt = first + a.outputs[0].token_ids + [7, 8, 9]
    b = llm.generate({"prompt_token_ids": b_prompt}, greedy, use_tqdm=False)[0]
    assert b.num_cached_tokens >= 32
    assert_replays(llm, b_prompt, b.outputs[0])


def test_pd_loaded_kv_replays_bit_for_bit(tmp_path) -> None:
    """The decode side's rollout, over KV prefilled by the producer and loaded through the PD
    connector, is reproduced exactly by scoring on either side."""
    from execstate.engine.config import EngineConfig
    from execstate.engine.llm_engine import LLMEngine
    from execstate.engine.pd_connector import PDConfig
    from execstate.engine.scorer import score_tokens

    model_dir = make_random("qwen3_moe", tmp_path, seed=5)

    def pd_engine(role: str) -> LLMEngine:
        pd = PDConfig(role=role, timeout_s=5.0, secret="bitwise-replay-test-secret-0123456789")
        return LLMEngine(EngineConfig(model=str(model_dir), enable_return_routed_experts=True, kv_transfer=pd))

    def run(e: LLMEngine, ids: list[int], params: SamplingParams, kv=None):
        rid = e.add_request({"prompt_token_ids": ids}, params, kv_transfer_params=kv)
        while True:
            for out in e.step():
                if out.request_id == rid and out.finished:
                    return out

    p, d = pd_engine("kv_producer"), pd_engine("kv_consumer")
    try:
        for seed, n in ((1, 48), (2, 21)):
            ids = np.random.default_rng(seed).integers(3, 500, n).tolist()
            handed = run(p, ids, SamplingParams(temperature=0.0, max_tokens=1), kv={"do_remote_decode": True})
            params = SamplingParams(temperature=0.8, seed=seed, max_tokens=10, ignore_eos=True, logprobs=0)
            out = run(d, ids, params, kv=handed.kv_transfer_params)
            assert out.prompt_token_sources["transferred"] >= 16
            gen = out.outputs[0]
            want = rollout_logprobs(gen)
            for side in (d, p):
                scored = score_tokens(side, ids + gen.token_ids, gen.routed_experts)
                got = np.array(scored.logprobs[len(ids) - 1:], dtype=np.float64)
                assert got.tobytes() == want.tobytes()
    finally:
        p.pd.close()
        d.pd.close()
