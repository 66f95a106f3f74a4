"""bf16 arithmetic (``compute_dtype="bfloat16"``: model/weight_formats.py, kernels/gemm_bf16dot.py).

Oracles: transformers' bf16 model (``model.to(torch.bfloat16)``, which rounds every activation
and every matmul output to bf16) within a stated tolerance, and transformers' fp32 model (ours
no farther from it than transformers' bf16 is, within 25%); the formats each module is given
(the router and the shared-expert gate stay in fp32 arithmetic). Batch invariance and replay:
tests/kernels/test_bf16dot_kernels.py, tests/kernels/test_decode_layer.py,
tests/engine/test_bitwise_replay.py.
Run with ``-s`` to see the measured numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from execstate.kernels import cpu
from execstate.kernels.weight_format import WeightFormat
from execstate.model.context import RouteCapture, StepContext
from execstate.model.layers import Linear
from execstate.model.loader import load_model
from execstate.model.moe import SparseMoE
from execstate.model.random_models import make_random
from execstate.model.replay_attention import KernelCausalAttention
from execstate.model.transformer import CausalLM
from execstate.model.weight_formats import use_bf16_arithmetic

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
PARITY_ARCHS = ["qwen3_moe", "llama", "mixtral", "qwen2_moe"]
# Measured (3 prompts x 24 tokens, HF's routes forced), relative to max|logit|:
#   max|ours bf16 - HF bf16| 0.018-0.061, top-1 agreement with HF bf16 69-72 of 72;
#   max|ours bf16 - HF fp32| 0.014-0.140 vs max|HF bf16 - HF fp32| 0.023-0.161 (ratio <= 1.05).
MAX_REL_DIFF_VS_HF_BF16 = 0.08
MIN_TOP1_AGREEMENT = 0.93
MAX_RATIO_TO_HF_BF16_ERROR = 1.25  # ours vs HF fp32, over HF bf16 vs HF fp32


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_random(arch, root / arch, seed=i) for i, arch in enumerate(PARITY_ARCHS)}


def bf16_arith_model(path: Path) -> CausalLM:
    model = load_model(path)
    model.store_weights_bf16()
    use_bf16_arithmetic(model)
    model.use_cpu_kernels(True)
    return model


@torch.no_grad()
def run(model: CausalLM, ids: torch.Tensor, forced: torch.Tensor | None = None) -> torch.Tensor:
    c = model.config
    mask = None if forced is None else torch.ones(len(ids), dtype=torch.bool)
    routes = RouteCapture(len(ids), c.num_moe_layers, c.top_k, forced, mask) if c.is_moe else None
    with StepContext(torch.arange(len(ids)), KernelCausalAttention(len(ids)), routes) as ctx:
        return model.compute_logits(model(ids, ctx))


def ids_of(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed))


def test_formats_route_in_fp32(checkpoints: dict[str, Path]) -> None:
    model = bf16_arith_model(checkpoints["qwen2_moe"])
    gates = set()
    for m in model.modules():
        if isinstance(m, SparseMoE):
            assert m.weight_format is WeightFormat.BF16_DOT
            gates |= {id(m.router), id(m.shared_expert_gate)}
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert len(gates) >= 4 and model.head_format is WeightFormat.BF16_DOT
    for m in linears:
        assert m.weight_format is (None if id(m) in gates else WeightFormat.BF16_DOT)
        assert m.weight.dtype == torch.bfloat16


def _hf_run(hf, ids: torch.Tensor, top_k: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    with torch.no_grad():
        out = hf(ids[None], output_router_logits=top_k is not None)
    if top_k is None:
        return out.logits[0].float(), None
    probs = torch.stack([torch.softmax(r.float(), dim=-1) for r in out.router_logits], dim=1)
    return out.logits[0].float(), torch.topk(probs, top_k, dim=-1).indices


@pytest.mark.parametrize("arch", PARITY_ARCHS)
def test_parity_with_transformers_bf16(arch: str, checkpoints: dict[str, Path]) -> None:
    """Teacher-forced logits of 3 prompts vs transformers' bf16 model, HF's routes forced."""
    model = bf16_arith_model(checkpoints[arch])
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoints[arch], dtype=torch.float32, experts_implementation="eager").eval()
    c = model.config
    top_k = c.top_k if c.is_moe else None
    prompts = [ids_of(24, seed) for seed in range(3)]
    ref32 = [_hf_run(hf, ids, top_k) for ids in prompts]
    hf = hf.to(torch.bfloat16)
    ref16 = [_hf_run(hf, ids, top_k) for ids in prompts]
    rel16 = rel32 = hf16_vs_32 = 0.0
    top1 = total = 0
    for ids, (want32, _), (want16, routes16) in zip(prompts, ref32, ref16, strict=True):
        ours = run(model, ids, routes16)
        scale = want32.abs().max().item()
        rel16 = max(rel16, (ours - want16).abs().max().item() / scale)
        rel32 = max(rel32, (ours - want32).abs().max().item() / scale)
        hf16_vs_32 = max(hf16_vs_32, (want16 - want32).abs().max().item() / scale)
        top1 += int((ours.argmax(-1) == want16.argmax(-1)).sum())
        total += len(ids)
    print(f"{arch}: max|ours bf16 - HF bf16| = {rel16:.4f}, max|ours bf16 - HF fp32| = {rel32:.4f}, "
          f"max|HF bf16 - HF fp32| = {hf16_vs_32:.4f} (x max|logit|); top-1 vs HF bf16 {top1}/{total}")
    assert rel16 <= MAX_REL_DIFF_VS_HF_BF16
    assert top1 / total >= MIN_TOP1_AGREEMENT
    assert rel32 <= MAX_RATIO_TO_HF_BF16_ERROR * hf16_vs_32  # as near to fp32 as HF's own bf16
