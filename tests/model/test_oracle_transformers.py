"""Our model vs transformers 5.23 on tiny random checkpoints of every supported family.

Teacher-forced logits on one sequence must agree to 1e-4 (fp32); the top-k expert set of
every (token, MoE layer) must equal the one transformers' router logits give; forced
routes must replay bitwise. Run with ``-s`` to see the measured numbers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

from execstate.model.context import RouteCapture, StepContext
from execstate.model.dense_attention import DenseCausalAttention
from execstate.model.loader import load_model
from execstate.model.random_models import ARCHITECTURES, make_random
from execstate.model.transformer import CausalLM

SEQ_LEN = 24
MOE_ARCHS = [a for a in ARCHITECTURES if a in ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")]
NEAR_TIE = 1e-6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_random(arch, root / arch, seed=i) for i, arch in enumerate(ARCHITECTURES)}


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (SEQ_LEN,), generator=torch.Generator().manual_seed(seed))


def _hf(path: Path, dtype: torch.dtype = torch.float32) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, experts_implementation="eager").eval()


@torch.no_grad()
def _run(model: CausalLM, ids: torch.Tensor, forced_ids: torch.Tensor | None = None,
         forced_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    c = model.config
    routes = RouteCapture(len(ids), c.num_moe_layers, c.top_k, forced_ids, forced_mask) if c.is_moe else None
    with StepContext(torch.arange(len(ids)), DenseCausalAttention(), routes) as ctx:
        logits = model.compute_logits(model(ids, ctx))
    return logits, None if routes is None else routes.ids.clone()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_logits_and_routes_match_transformers(arch: str, checkpoints: dict[str, Path]) -> None:
    ids = _tokens()
    hf = _hf(checkpoints[arch])
    ours = load_model(checkpoints[arch])
    c = ours.config
    hf_moe = tuple(i for i, layer in enumerate(hf.model.layers) if hasattr(layer.mlp, "experts"))
    assert c.moe_layers == hf_moe
    with torch.no_grad():
        out = hf(ids[None], output_router_logits=c.is_moe)
    logits, routes = _run(ours, ids)
    assert logits.dtype == torch.float32 and logits.shape == (SEQ_LEN, c.vocab_size)
    diff = (logits - out.logits[0]).abs().max().item()
    msg = f"{arch}: max|dlogit|={diff:.2e} (max|logit|={logits.abs().max().item():.2f})"
    if c.is_moe:
        assert routes is not None and len(out.router_logits) == c.num_moe_layers
        probs = torch.stack([torch.softmax(r.float(), dim=-1) for r in out.router_logits], dim=1)  # [T, M, E]
        top = torch.topk(probs, c.top_k + 1, dim=-1)
        hf_sets = top.indices[..., : c.top_k].sort(dim=-1).values
        our_sets = routes.long().sort(dim=-1).values
        equal = (hf_sets == our_sets).all(dim=-1)
        near_tie = (top.values[..., c.top_k - 1] - top.values[..., c.top_k]) < NEAR_TIE
        msg += (f", route sets equal {int(equal.sum())}/{equal.numel()}, near-ties {int(near_tie.sum())}, "
                f"mismatches outside near-ties {int((~equal & ~near_tie).sum())}")
        assert equal.float().mean().item() >= 0.999 or not (~equal & ~near_tie).any()
        # within a row, ids are ordered by descending router probability
        ordered = probs.gather(-1, routes.long())
        assert (ordered[..., :-1] >= ordered[..., 1:]).all()
        assert routes.min() >= 0 and routes.max() < c.num_experts
        assert (our_sets[..., 1:] != our_sets[..., :-1]).all()  # no duplicates in a row
    print(msg)
    assert diff <= 1e-4, msg


def _hf_routes(router_logits: tuple[torch.Tensor, ...], top_k: int) -> torch.Tensor:
    """HF's own choice: top-k of softmax(router logits), as int64 ``[T, M, k]``."""
    probs = torch.stack([torch.softmax(r.float(), dim=-1) for r in router_logits], dim=1)
    return torch.topk(probs, top_k, dim=-1).indices


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_bf16_close_to_transformers_bf16_and_to_fp32(arch: str, checkpoints: dict[str, Path]) -> None:
    """bf16 rounding differs between implementations (fused qkv, SDPA kernels), so routes can
    flip where the top-k gap is within bf16 noise; forcing the reference's routes removes
    that discontinuity and leaves only rounding differences."""
    ids = _tokens(1)
    model = load_model(checkpoints[arch], dtype=torch.bfloat16)
    fp32_model = load_model(checkpoints[arch])
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    c = model.config
    with torch.no_grad():
        out = _hf(checkpoints[arch], torch.bfloat16)(ids[None], output_router_logits=c.is_moe)
    want = out.logits[0].float()
    fp32, fp32_routes = _run(fp32_model, ids)
    everyone = torch.ones(SEQ_LEN, dtype=torch.bool)
    if c.is_moe:
        free, free_routes = _run(model, ids)
        hf_routes = _hf_routes(out.router_logits, c.top_k)
        agree = (free_routes.long().sort(-1).values == hf_routes.sort(-1).values).all(-1)
        logits, _ = _run(model, ids, hf_routes, everyone)
        vs_fp32, _ = _run(model, ids, fp32_routes.long(), everyone)
        route_msg = f", free routes agree with HF bf16 on {int(agree.sum())}/{agree.numel()}"
        assert agree.float().mean().item() >= 0.9
    else:
        logits, _ = _run(model, ids)
        vs_fp32, route_msg = logits, ""
    scale = fp32.abs().max().item()
    diff_hf = (logits - want).abs().max().item()
    diff_fp32 = (vs_fp32 - fp32).abs().max().item()
    print(f"{arch} bf16: max|ours-hf|={diff_hf:.3f} max|bf16-fp32|={diff_fp32:.3f} "
          f"(max|logit|={scale:.2f}){route_msg}")
    assert logits.dtype == torch.float32
    assert diff_hf <= 0.05 * scale
    assert diff_fp32 <= 0.1 * scale


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_forced_routes_replay(arch: str, checkpoints: dict[str, Path]) -> None:
    model = load_model(checkpoints[arch])
    c = model.config
    ids = _tokens(2)
    logits, recorded = _run(model, ids)
    assert recorded is not None
    everyone = torch.ones(SEQ_LEN, dtype=torch.bool)
    # forcing the recorded routes reproduces the logits bitwise, for all or some tokens
    replay, replay_routes = _run(model, ids, recorded.long(), everyone)
    assert torch.equal(replay, logits) and torch.equal(replay_routes, recorded)
    half = torch.arange(SEQ_LEN) % 2 == 0
    partial, _ = _run(model, ids, recorded.long(), half)
    assert torch.equal(partial, logits)
    # forcing different experts (the top-k of the *reversed* ranking) for tokens 10.. in MoE layer 0
    other = recorded.long().clone()
    other[10:, 0] = (other[10:, 0] + 1 + torch.arange(c.top_k)) % c.num_experts
    other[10:, 0] = torch.where(torch.isin(other[10:, 0], recorded[10:, 0].long()),
                                (other[10:, 0] + c.top_k) % c.num_experts, other[10:, 0])
    mask = torch.arange(SEQ_LEN) >= 10
    changed, changed_routes = _run(model, ids, other, mask)
    assert torch.equal(changed_routes[mask].long(), other[mask])  # forced rows record the forced ids
    # causal: earlier tokens are untouched (up to GEMM batch-composition rounding)
    assert (changed[:10] - logits[:10]).abs().max().item() < 1e-5
    assert (changed[10:] - logits[10:]).abs().max().item() > 1e-2


def test_sharded_and_fused_checkpoints_load_identically(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """save_pretrained (5.23) writes per-expert tensors; the fused [E, 2I, H] layout is what
    ``state_dict()`` holds in memory. Both, and a sharded copy, give bitwise-equal logits."""
    ids = _tokens(3)
    for arch in ("qwen2_moe", "mixtral"):
        src = checkpoints[arch]
        base, _ = _run(load_model(src), ids)
        hf = _hf(src)
        sharded = tmp_path / f"{arch}-sharded"
        hf.save_pretrained(sharded, max_shard_size="50KB")
        index = json.loads((sharded / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 2 and not (sharded / "model.safetensors").exists()
        assert any(".experts.0." in k for k in index["weight_map"])  # per-expert names on disk
        fused = tmp_path / f"{arch}-fused"
        fused.mkdir()
        shutil.copy(src / "config.json", fused / "config.json")
        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
        save_file(state, fused / "model.safetensors")
        for path in (sharded, fused):
            logits, _ = _run(load_model(path), ids)
            assert torch.equal(logits, base), f"{arch}: {path.name}"
        with torch.no_grad():  # transformers reads the fused layout as-is too
            diff = (_hf(fused)(ids[None]).logits - hf(ids[None]).logits).abs().max().item()
        assert diff < 1e-5


def test_forward_requires_an_active_context(checkpoints: dict[str, Path]) -> None:
    model = load_model(checkpoints["qwen3"])
    ctx = StepContext(torch.arange(4), DenseCausalAttention())
    with pytest.raises(RuntimeError, match="outside"):
        model(torch.arange(4), ctx)
    with ctx, pytest.raises(ValueError, match="positions"):
        model(torch.arange(4), StepContext(torch.arange(3), DenseCausalAttention()).__enter__())
    moe = load_model(checkpoints["qwen3_moe"])
    with StepContext(torch.arange(4), DenseCausalAttention(), RouteCapture(4, 1, 2)) as ctx2, \
            pytest.raises(ValueError, match="RouteCapture"):
        moe(torch.arange(4), ctx2)
