"""An engine with ``dtype="bfloat16"`` on execstate's kernels: bf16 weights, fp32 activations and
KV cache, its own provenance numerics; state never crosses between it and an fp32 engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from execstate import LLM, SamplingParams
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.pd_connector import PDConfig
from execstate.identity.execution import ExecutionIdentity
from execstate.kernels import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
SECRET = "bf16-test-secret-0123456789abcdef"


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def _engine(model_dir, dtype: str, role: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), dtype=dtype, enable_return_routed_experts=True, block_size=16,
                                  kv_transfer=PDConfig(role=role, timeout_s=5.0, secret=SECRET)))


def _run(e: LLMEngine, ids, params=GREEDY, kv=None):
    rid = e.add_request({"prompt_token_ids": ids}, params, kv_transfer_params=kv)
    while True:
        for out in e.step():
            if out.request_id == rid and out.finished:
                return out


def test_bf16_engine_weights_kv_provenance_and_cache(moe_dir) -> None:
    bf16, fp32 = LLM(str(moe_dir), dtype="bfloat16", block_size=16), LLM(str(moe_dir), block_size=16)
    eb, ef = bf16.engine, fp32.engine
    assert eb.model.kernels and eb.kv_pool.k.dtype == torch.float32
    assert {p.dtype for p in eb.model.parameters() if p.dim() >= 2} == {torch.bfloat16}
    assert {p.dtype for p in eb.model.parameters() if p.dim() == 1} == {torch.float32}
    pb, pf = eb.provenance, ef.provenance
    assert (pb.dtype, pb.numerics) == ("bfloat16", "eager+cpu-avx2-v3-bf16w")
    assert (pf.dtype, pf.numerics) == ("float32", "eager+cpu-avx2-v2")
    assert pb.weights_version != pf.weights_version  # the digest covers the stored (bf16) bytes
    assert ExecutionIdentity(pb).root != ExecutionIdentity(pf).root
    prompt = _prompt(7, 35)
    out_b = bf16.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0]
    out_f = fp32.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0]
    assert len(out_b.outputs[0].token_ids) == 8
    # each engine's cache holds its own keys only
    keys_b, keys_f = ExecutionIdentity(pb).chain(prompt, 16), ExecutionIdentity(pf).chain(prompt, 16)
    for own, other in zip(keys_b, keys_f, strict=True):
        assert eb.block_pool.lookup(own) is not None and eb.block_pool.lookup(other) is None
    assert len(out_f.outputs[0].token_ids) == 8
    # The same sequence in a batch: same tokens, and the same logprobs bit for bit where the
    # packed (AVX-512) kernels take the prefill rows (batch invariance); elsewhere torch's bf16
    # GEMM rounds a prefill's activations by its row count (measured 4e-3).
    many = bf16.generate([{"prompt_token_ids": _prompt(s, 35)} for s in (1, 2)] + [{"prompt_token_ids": prompt}],
                         GREEDY, use_tqdm=False)
    assert many[2].outputs[0].token_ids == out_b.outputs[0].token_ids
    if cpu.PACKED:
        assert many[2].outputs[0].cumulative_logprob == out_b.outputs[0].cumulative_logprob
    else:
        assert many[2].outputs[0].cumulative_logprob == pytest.approx(out_b.outputs[0].cumulative_logprob, abs=0.05)


@pytest.mark.parametrize(("p_dtype", "d_dtype"), [("bfloat16", "float32"), ("float32", "bfloat16")])
def test_pd_transfer_between_bf16_and_fp32_is_refused(moe_dir, p_dtype: str, d_dtype: str) -> None:
    """Same model, same KV layout (fp32 KV on both), different numerics: D refuses P's blocks on
    the provenance check (a request-level error) and keeps serving."""
    p, d = _engine(moe_dir, p_dtype, "kv_producer"), _engine(moe_dir, d_dtype, "kv_consumer")
    try:
        assert p.kv_pool.k.dtype == d.kv_pool.k.dtype == torch.float32
        ids = _prompt(5, 40)
        handed = _run(p, ids, SamplingParams(temperature=0.0, max_tokens=1), kv={"do_remote_decode": True})
        assert handed.error is None
        out = _run(d, ids, kv=handed.kv_transfer_params)
        assert out.error and "provenance" in out.error
        assert out.outputs[0].token_ids == [] and d.block_pool.num_used == 0
        assert len(_run(d, _prompt(6, 20)).outputs[0].token_ids) == 8
        d.check_integrity()
    finally:
        p.pd.close()
        d.pd.close()


def test_pd_transfer_between_two_bf16_engines_is_accepted(moe_dir) -> None:
    p, d = _engine(moe_dir, "bfloat16", "kv_producer"), _engine(moe_dir, "bfloat16", "kv_consumer")
    try:
        ids = _prompt(5, 40)
        handed = _run(p, ids, SamplingParams(temperature=0.0, max_tokens=1), kv={"do_remote_decode": True})
        out = _run(d, ids, kv=handed.kv_transfer_params)
        assert out.error is None and out.prompt_token_sources["transferred"] == 32
        assert out.outputs[0].token_ids == _run(p, ids).outputs[0].token_ids
    finally:
        p.pd.close()
        d.pd.close()


def test_weight_update_of_a_bf16_engine_rounds_into_the_bf16_weights(moe_dir, moe_dir_other_weights) -> None:
    """An update (fp32 checkpoint) is rounded into the bf16 parameters in place: the engine then
    equals a bf16 engine started on the new weights (same weights version, same tokens)."""
    updated = LLMEngine(EngineConfig(model=str(moe_dir), dtype="bfloat16", block_size=16))
    fresh = LLMEngine(EngineConfig(model=str(moe_dir_other_weights), dtype="bfloat16", block_size=16))
    before = updated.provenance.weights_version
    updated.update_weights(moe_dir_other_weights)
    assert {p.dtype for p in updated.model.parameters() if p.dim() >= 2} == {torch.bfloat16}
    assert updated.provenance.weights_version == fresh.provenance.weights_version != before
    ids = _prompt(3, 20)
    assert _run(updated, ids).outputs[0].token_ids == _run(fresh, ids).outputs[0].token_ids
