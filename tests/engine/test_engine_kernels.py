"""The engine's ``kernels`` setting on a tiny random Qwen3-MoE: torch ops vs execstate's C
kernels (execstate.kernels.cpu). Same tokens and routes, different provenance numerics,
hence different block keys (a cache never mixes state of the two)."""

from __future__ import annotations

import numpy as np
import pytest

from execstate import LLM, SamplingParams
from execstate.engine.config import EngineConfig
from execstate.identity.execution import ExecutionIdentity
from execstate.kernels import cpu, decode_layer

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
PROMPT = np.random.default_rng(7).integers(3, 500, 35).tolist()  # 2 full blocks of 16 + 3

needs_kernels = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")


def _llm(path, **kw) -> LLM:
    return LLM(str(path), enable_return_routed_experts=True, block_size=16, **kw)


def _counted(calls: dict[str, int], name: str, real):
    def call(*args):
        calls[name] += 1
        return real(*args)

    return call


def _count_kernel_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"linear_if_small": 0, "moe": 0}
    for name in calls:
        monkeypatch.setattr(cpu, name, _counted(calls, name, getattr(cpu, name)))
    calls["moe_in_layer_call"] = 0
    real = decode_layer.run_layer

    def run_layer(layer, w, *args, **kw):
        calls["moe_in_layer_call"] += bool(w.top_k)
        return real(layer, w, *args, **kw)

    monkeypatch.setattr(decode_layer, "run_layer", run_layer)
    return calls


@needs_kernels
def test_torch_vs_execstate_kernels(moe_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_kernel_calls(monkeypatch)
    plain = _llm(moe_dir, kernels="torch")
    out_plain = plain.generate({"prompt_token_ids": PROMPT}, GREEDY, use_tqdm=False)[0].outputs[0]
    assert calls == {"linear_if_small": 0, "moe": 0, "moe_in_layer_call": 0}
    fast = _llm(moe_dir, kernels="execstate")
    out_fast = fast.generate({"prompt_token_ids": PROMPT}, GREEDY, use_tqdm=False)[0].outputs[0]
    # The prefill's MoE blocks on the kernel; decode steps (1 row): every layer's MoE block inside
    # its whole-layer call, at each of 7 steps.
    n_moe = fast.engine.model_config.num_moe_layers
    assert calls["moe"] >= n_moe and calls["moe_in_layer_call"] == 7 * n_moe and calls["linear_if_small"] > 7

    p_plain, p_fast = plain.engine.provenance, fast.engine.provenance
    assert p_plain.numerics == "eager+cpu-torch-v1"
    assert p_fast.numerics == f"eager+{cpu.KERNEL_SET}" == "eager+cpu-avx2-v2"
    assert (p_plain.model_id, p_plain.weights_version, p_plain.dtype) == (
        p_fast.model_id, p_fast.weights_version, p_fast.dtype)
    assert not plain.engine.model.kernels and fast.engine.model.kernels

    # Block keys differ for every block, and each engine's cache holds only its own keys.
    keys_plain = ExecutionIdentity(p_plain).chain(PROMPT, 16)
    keys_fast = ExecutionIdentity(p_fast).chain(PROMPT, 16)
    assert len(keys_plain) == 2 and ExecutionIdentity(p_plain).root != ExecutionIdentity(p_fast).root
    assert not set(keys_plain) & set(keys_fast)
    for key_own, key_other in zip(keys_fast, keys_plain, strict=True):
        assert fast.engine.block_pool.lookup(key_own) is not None
        assert fast.engine.block_pool.lookup(key_other) is None
        assert plain.engine.block_pool.lookup(key_other) is not None
        assert plain.engine.block_pool.lookup(key_own) is None

    assert out_fast.token_ids == out_plain.token_ids and len(out_fast.token_ids) == 8
    assert out_fast.cumulative_logprob == pytest.approx(out_plain.cumulative_logprob, abs=1e-3)
    r_plain, r_fast = out_plain.routed_experts, out_fast.routed_experts
    assert r_fast.shape == r_plain.shape == (len(PROMPT) + 8 - 1, n_moe, 2)
    np.testing.assert_array_equal(r_fast, r_plain)


@needs_kernels
def test_batched_decode_routes_equal_the_torch_path(moe_dir) -> None:
    # Decode steps of 3 rows: the whole-layer calls write their routes into the capture's step
    # buffer ([layers, rows, k]); the routes returned are the torch path's, row by row.
    prompts = [{"prompt_token_ids": PROMPT[: 20 + 5 * i]} for i in range(3)]
    outs = {k: _llm(moe_dir, kernels=k).generate(prompts, GREEDY, use_tqdm=False) for k in ("torch", "execstate")}
    for a, b in zip(outs["torch"], outs["execstate"], strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        np.testing.assert_array_equal(a.outputs[0].routed_experts, b.outputs[0].routed_experts)


def test_kernels_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="kernels must be one of"):
        EngineConfig(model="unused", kernels="bogus")
    with pytest.raises(ValueError, match="kernels must be one of"):
        EngineConfig(model="unused", kernels="")


def test_execstate_kernels_need_cpu(moe_dir) -> None:
    with pytest.raises(ValueError, match="kernels='execstate' needs device cpu, got meta"):
        EngineConfig(model=str(moe_dir), kernels="execstate", device="meta").use_cpu_kernels()


def test_auto_kernels_follow_dtype_and_availability(moe_dir) -> None:
    bf16 = _llm(moe_dir, kernels="auto", dtype="bfloat16").engine
    assert bf16.provenance.numerics == ("eager+cpu-avx2-v3-bf16w" if cpu.available() else "eager+cpu-torch-v1")
    assert bf16.provenance.dtype == "bfloat16"
    assert _llm(moe_dir, kernels="torch", dtype="bfloat16").engine.provenance.numerics == "eager+cpu-torch-v1"
    auto = _llm(moe_dir, kernels="auto")
    assert auto.engine.provenance.numerics == ("eager+cpu-avx2-v2" if cpu.available() else "eager+cpu-torch-v1")
    assert auto.engine.model.kernels == cpu.available()
    assert EngineConfig(model=str(moe_dir)).kernels == "auto"
    assert _llm(moe_dir, kernels="torch").engine.provenance.numerics == "eager+cpu-torch-v1"
