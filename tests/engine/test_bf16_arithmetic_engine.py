"""An engine in bf16 arithmetic (``dtype="bfloat16", compute_dtype="bfloat16"``): its numerics id
(and the fallback's where AVX512-BF16 is missing), its cache never shared with the other modes,
a sequence's logprobs the same bits alone and in a batch, weight updates, bad configurations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import execstate.model.transformer as transformer
from execstate import LLM, SamplingParams
from execstate.engine.config import EngineConfig
from execstate.identity.execution import ExecutionIdentity
from execstate.kernels import cpu, gemm_bf16dot

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
BF16 = {"dtype": "bfloat16", "compute_dtype": "bfloat16"}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def test_numerics_id_cache_and_batch_invariance(moe_dir) -> None:
    arith, widened = LLM(str(moe_dir), **BF16), LLM(str(moe_dir), dtype="bfloat16")
    pa, pw = arith.engine.provenance, widened.engine.provenance
    want = "cpu-avx512bf16-v1" if gemm_bf16dot.NATIVE else "cpu-avx2-bf16emu-v1"
    assert (pa.dtype, pa.numerics) == ("bfloat16", f"eager+{want}")
    # same bytes, other math
    assert pa.weights_version == pw.weights_version and ExecutionIdentity(pa).root != ExecutionIdentity(pw).root
    assert arith.engine.kv_pool.k.dtype == torch.float32
    prompt = _prompt(7, 45)
    alone = arith.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0]
    many = arith.generate([{"prompt_token_ids": _prompt(s, 30 + s)} for s in (1, 2, 3)]
                          + [{"prompt_token_ids": prompt}], GREEDY, use_tqdm=False)[3].outputs[0]
    assert many.token_ids == alone.token_ids and many.logprobs == alone.logprobs
    other = widened.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0]
    assert other.logprobs != alone.logprobs  # the arithmetic differs (activations rounded)


def test_fallback_without_avx512_bf16_has_its_own_id_and_the_same_bits(moe_dir, monkeypatch) -> None:
    """Where AVX512-BF16 is missing the FMA emulation runs (the same order): its own numerics id,
    and the same tokens and logprobs as the vdpbf16ps kernels on normal-range values."""
    native = LLM(str(moe_dir), **BF16)
    prompts = [{"prompt_token_ids": _prompt(s, 20 + 7 * s)} for s in range(3)]
    want = native.generate(prompts, GREEDY, use_tqdm=False)
    monkeypatch.setattr(gemm_bf16dot, "NATIVE", False)  # as on a CPU without AVX512-BF16
    monkeypatch.setattr(transformer, "decode_layers", lambda *a, **k: None)  # (its C side decides alone)
    emu = LLM(str(moe_dir), **BF16)
    assert emu.engine.provenance.numerics == "eager+cpu-avx2-bf16emu-v1"
    got = emu.generate(prompts, GREEDY, use_tqdm=False)
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids and a.outputs[0].logprobs == b.outputs[0].logprobs


def test_weight_update_keeps_the_mode(moe_dir, moe_dir_other_weights) -> None:
    updated, fresh = LLM(str(moe_dir), **BF16), LLM(str(moe_dir_other_weights), **BF16)
    updated.update_weights(moe_dir_other_weights)
    pu, pf = updated.engine.provenance, fresh.engine.provenance
    assert (pu.weights_version, pu.numerics) == (pf.weights_version, pf.numerics)
    ids = {"prompt_token_ids": _prompt(3, 20)}
    a = updated.generate(ids, GREEDY, use_tqdm=False)[0].outputs[0]
    b = fresh.generate(ids, GREEDY, use_tqdm=False)[0].outputs[0]
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


@pytest.mark.parametrize("kwargs", [{"compute_dtype": "bfloat16"}, {**BF16, "kernels": "torch"},
                                    {"compute_dtype": "float16"}])
def test_bad_configurations(kwargs) -> None:
    with pytest.raises(ValueError, match="compute_dtype"):
        EngineConfig(model="x", **kwargs)
