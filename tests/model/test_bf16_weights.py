"""bf16 weights on an fp32 model (model/bf16_weights.py) on execstate's CPU kernels.

Oracles: an fp32 model whose weights were rounded to bf16 beforehand (every step must equal
it bit for bit where the CPU has AVX-512, decode-sized steps everywhere: the bf16 kernels equal
the fp32 ones on widened weights); transformers' bf16 model (``model.to(torch.bfloat16)``) within a stated tolerance;
the fp32 model. Run with ``-s`` to see the measured numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from execstate.kernels import cpu
from execstate.model.context import RouteCapture, StepContext
from execstate.model.dense_attention import DenseCausalAttention
from execstate.model.loader import load_model
from execstate.model.random_models import ARCHITECTURES, make_random
from execstate.model.transformer import CausalLM

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
PARITY_ARCHS = ["qwen3_moe", "llama", "mixtral", "qwen2_moe"]
# Measured (3 prompts x 24 tokens, HF's routes forced), relative to max|logit|:
#   max|ours bf16w - HF bf16| 0.018-0.055, top-1 agreement with HF bf16 69-71 of 72;
#   max|ours bf16w - HF fp32| 0.010-0.022 vs max|HF bf16 - HF fp32| 0.019-0.21.
MAX_REL_DIFF_VS_HF_BF16 = 0.08
MIN_TOP1_AGREEMENT = 0.93


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_random(arch, root / arch, seed=i) for i, arch in enumerate(ARCHITECTURES)
            if arch in PARITY_ARCHS}


def _bf16_model(path: Path) -> CausalLM:
    model = load_model(path)
    model.store_weights_bf16()
    model.use_cpu_kernels(True)
    return model


@torch.no_grad()
def _run(model: CausalLM, ids: torch.Tensor, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    c = model.config
    mask = None if forced is None else torch.ones(len(ids), dtype=torch.bool)
    routes = RouteCapture(len(ids), c.num_moe_layers, c.top_k, forced, mask) if c.is_moe else None
    with StepContext(torch.arange(len(ids)), DenseCausalAttention(), routes) as ctx:
        logits = model.compute_logits(model(ids, ctx))
    return logits, torch.empty(0) if routes is None else routes.ids.clone()


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed))


def test_store_weights_bf16_rounds_the_matrices_only(checkpoints: dict[str, Path]) -> None:
    fp32 = load_model(checkpoints["qwen3_moe"])
    model = load_model(checkpoints["qwen3_moe"])
    model.store_weights_bf16()
    ref = dict(fp32.named_parameters())
    for name, p in model.named_parameters():
        if ref[name].dim() >= 2:
            assert p.dtype == torch.bfloat16 and p.is_contiguous(), name
            assert torch.equal(p, ref[name].to(torch.bfloat16)), name
        else:  # norms' weights
            assert p.dtype == torch.float32 and torch.equal(p, ref[name]), name
    size = sum(p.nbytes for p in model.parameters())
    assert 0.5 < size / sum(p.nbytes for p in fp32.parameters()) < 0.51


def test_tied_embeddings_stay_tied(tmp_path: Path) -> None:
    path = make_random("llama", tmp_path / "tied", seed=3, tie_word_embeddings=True)
    model = _bf16_model(path)
    assert model.lm_head is None and model.embed_tokens.weight.dtype == torch.bfloat16
    logits, _ = _run(model, _ids(5, 0))
    assert logits.dtype == torch.float32 and logits.isfinite().all()


@pytest.mark.parametrize("arch", ["qwen3_moe", "llama"])
def test_steps_equal_fp32_on_rounded_weights_bitwise(arch: str, checkpoints: dict[str, Path]) -> None:
    """Every step size on the bf16 kernels equals the fp32 kernels on the rounded weights, bit for
    bit: decode-sized steps always, prefill-sized ones where the packed (AVX-512) kernels run."""
    rounded = load_model(checkpoints[arch])
    for p in rounded.parameters():
        if p.dim() >= 2:
            p.copy_(p.to(torch.bfloat16).float())
    rounded.use_cpu_kernels(True)
    model = _bf16_model(checkpoints[arch])
    for n in (1, 8, 24):  # up to MAX_LINEAR_ROWS_BF16 rows: every matmul on the bf16 kernels
        ids = _ids(n, n)
        (a, ra), (b, rb) = _run(model, ids), _run(rounded, ids)
        assert torch.equal(a, b) and torch.equal(ra, rb), f"{arch} T={n}"
    ids = _ids(80, 80)
    (a, ra), (b, rb) = _run(model, ids), _run(rounded, ids)
    if cpu.PACKED:  # the packed bf16 kernels widen the weights: the fp32 packed kernels' bits
        assert torch.equal(a, b) and torch.equal(ra, rb), f"{arch} T=80"
        return
    # without AVX-512, torch's bf16 GEMM rounds activations to bf16: close, not equal
    if rounded.config.is_moe:
        b, _ = _run(rounded, ids, ra.long())
    rel = ((a - b).abs().max() / b.abs().max()).item()
    print(f"{arch}: prefill (80 rows) bf16-activation GEMM vs fp32 on rounded weights: max rel diff {rel:.4f}")
    assert 0 < rel < 0.03


def _hf_run(
    hf: transformers.PreTrainedModel, ids: torch.Tensor, top_k: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's fp32 logits and its own routes (top-k of softmax of its router logits) or None."""
    with torch.no_grad():
        out = hf(ids[None], output_router_logits=top_k is not None)
    if top_k is None:
        return out.logits[0].float(), None
    probs = torch.stack([torch.softmax(r.float(), dim=-1) for r in out.router_logits], dim=1)
    return out.logits[0].float(), torch.topk(probs, top_k, dim=-1).indices


@pytest.mark.parametrize("arch", PARITY_ARCHS)
def test_parity_with_transformers_bf16(arch: str, checkpoints: dict[str, Path]) -> None:
    """Teacher-forced logits of 3 prompts vs ``AutoModelForCausalLM.from_pretrained(...).to(bf16)``,
    with HF's routes forced (routes can flip within bf16 noise, see test_oracle_transformers).
    Also against HF fp32: bf16 weights with fp32 activations must be nearer to it than HF's bf16
    (which rounds every activation too) is."""
    model = _bf16_model(checkpoints[arch])
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoints[arch], dtype=torch.float32, experts_implementation="eager").eval()
    c = model.config
    top_k = c.top_k if c.is_moe else None
    prompts = [_ids(24, seed) for seed in range(3)]
    ref32 = [_hf_run(hf, ids, top_k) for ids in prompts]
    hf = hf.to(torch.bfloat16)
    ref16 = [_hf_run(hf, ids, top_k) for ids in prompts]
    rel16 = rel32 = hf16_vs_32 = 0.0
    top1 = total = 0
    for ids, (want32, routes32), (want16, routes16) in zip(prompts, ref32, ref16, strict=True):
        ours16, _ = _run(model, ids, routes16)
        ours32, _ = _run(model, ids, routes32)
        scale = want32.abs().max().item()
        rel16 = max(rel16, (ours16 - want16).abs().max().item() / scale)
        rel32 = max(rel32, (ours32 - want32).abs().max().item() / scale)
        hf16_vs_32 = max(hf16_vs_32, (want16 - want32).abs().max().item() / scale)
        top1 += int((ours16.argmax(-1) == want16.argmax(-1)).sum())
        total += len(ids)
    print(f"{arch}: max|ours bf16w - HF bf16| = {rel16:.4f}, max|ours bf16w - HF fp32| = {rel32:.4f}, "
          f"max|HF bf16 - HF fp32| = {hf16_vs_32:.4f} (x max|logit|); top-1 vs HF bf16 {top1}/{total}")
    assert rel16 <= MAX_REL_DIFF_VS_HF_BF16
    assert top1 / total >= MIN_TOP1_AGREEMENT
    assert rel32 < hf16_vs_32
