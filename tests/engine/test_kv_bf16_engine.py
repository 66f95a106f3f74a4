"""An engine with bf16 attention (``kv_cache_dtype="bfloat16"``): its numerics id in each weight
mode, a bf16 pool of half the bytes per block, a sequence's logprobs the same bits alone and in a
batch (batch invariance), other bits than the fp32 cache's, its cache never shared with fp32 KV,
bad configurations refused. Scoring equals generation bit for bit in this mode in
``test_bitwise_replay.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from execstate import LLM, SamplingParams
from execstate.engine.config import EngineConfig
from execstate.identity.execution import ExecutionIdentity
from execstate.kernels import cpu, gemm_bf16dot
from execstate.model.random_models import make_random

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
KV = {"kv_cache_dtype": "bfloat16"}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def _logprobs(llm: LLM, prompts: list[list[int]]):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def test_numerics_ids_and_pool(moe_dir) -> None:
    fp32, kv = LLM(str(moe_dir), num_kv_blocks=64), LLM(str(moe_dir), num_kv_blocks=64, **KV)
    assert fp32.engine.provenance.numerics == "eager+cpu-avx2-v2"
    assert kv.engine.provenance.numerics == "eager+cpu-avx2-v2-kvbf16"
    assert kv.engine.kv_pool.k.dtype is torch.bfloat16 and kv.engine.kv_pool.v.dtype is torch.bfloat16
    assert kv.engine.kv_pool.k.nbytes * 2 == fp32.engine.kv_pool.k.nbytes
    assert ExecutionIdentity(kv.engine.provenance).root != ExecutionIdentity(fp32.engine.provenance).root
    arith = LLM(str(moe_dir), dtype="bfloat16", compute_dtype="bfloat16", **KV)
    want = "cpu-avx512bf16-v2" if gemm_bf16dot.NATIVE else "cpu-avx2-bf16emu-v2"
    assert arith.engine.provenance.numerics == f"eager+{want}-kvbf16"
    assert LLM(str(moe_dir), dtype="bfloat16", **KV).engine.provenance.numerics == "eager+cpu-avx2-v3-bf16w-kvbf16"
    # the same memory holds twice the blocks
    mem = 1 << 20
    a = LLM(str(moe_dir), kv_cache_memory_bytes=mem, max_num_seqs=1024, max_model_len=64)
    b = LLM(str(moe_dir), kv_cache_memory_bytes=mem, max_num_seqs=1024, max_model_len=64, **KV)
    assert 2 * a.engine.kv_pool.num_blocks <= b.engine.kv_pool.num_blocks <= 2 * a.engine.kv_pool.num_blocks + 1


@pytest.mark.parametrize("mode", [{}, {"dtype": "bfloat16", "compute_dtype": "bfloat16"}])
def test_batch_invariant_and_not_the_fp32_cache(moe_dir, dense_dir, mode) -> None:
    for path in (moe_dir, dense_dir):
        llm = LLM(str(path), **mode, **KV)
        prompt = _prompt(7, 45)
        alone = _logprobs(llm, [prompt])[0]
        many = _logprobs(llm, [_prompt(s, 30 + s) for s in (1, 2, 3)] + [prompt])[3]
        assert many == alone
        fp32_kv = _logprobs(LLM(str(path), **mode), [prompt])[0]
        assert fp32_kv[1] != alone[1]  # the K/V are rounded: other bits
        # close: the first token's logprob within bf16's rounding of K/V
        assert abs(fp32_kv[1][0][fp32_kv[0][0]].logprob - alone[1][0][fp32_kv[0][0]].logprob) < 0.05


def test_bad_configurations(tmp_path) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(model="x", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="runs on the CPU kernels"):
        EngineConfig(model="x", kv_cache_dtype="bfloat16", kernels="torch")
    assert EngineConfig(model="x", kv_cache_dtype="bf16").kv_cache_dtype == "bfloat16"
    wide = make_random("llama", tmp_path, seed=1, hidden_size=272, num_attention_heads=17, num_key_value_heads=1,
                       head_dim=16, intermediate_size=64)
    with pytest.raises(ValueError, match="at most 16 query heads per KV head"):
        LLM(str(wide), **KV)
