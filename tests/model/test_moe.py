"""SparseMoE block against a per-token reference, route capture and forced routes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from execstate.model.config import ModelConfig
from execstate.model.context import RouteCapture, StepContext
from execstate.model.dense_attention import DenseCausalAttention
from execstate.model.moe import SparseMoE

ARCHS = ["Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM"]


def _block(arch: str, norm_topk_prob: bool = False, top_k: int = 3) -> SparseMoE:
    config = ModelConfig.from_dict(dict(
        architectures=[arch], hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, vocab_size=64,
        intermediate_size=24, moe_intermediate_size=24, shared_expert_intermediate_size=40,
        num_experts=6, num_local_experts=6, num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob))
    block = SparseMoE(config, moe_index=1).requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    for p in block.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    block.router.weight.mul_(4.0)
    return block


def _ctx(n: int, routes: RouteCapture | None) -> StepContext:
    return StepContext(torch.arange(n), DenseCausalAttention(), routes)


def _reference(block: SparseMoE, x: torch.Tensor,
               ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token: softmax, top-k (or the given ids), renormalise, weighted expert sum."""
    outs, chosen = [], []
    for t in range(x.shape[0]):
        probs = torch.softmax(block.router.weight.double() @ x[t].double(), dim=-1)
        e = torch.topk(probs, block.top_k).indices if ids is None else ids[t]
        w = probs[e]
        if block.norm_topk_prob:
            w = w / w.sum()
        y = torch.zeros(x.shape[1], dtype=torch.float64)
        for j, expert in enumerate(e.tolist()):
            gate, up = (block.w_gate_up[expert].double() @ x[t].double()).chunk(2)
            y += w[j] * (block.w_down[expert].double() @ (F.silu(gate) * up))
        if block.shared_expert is not None:
            shared = block.shared_expert.double()(x[t].double())
            y += torch.sigmoid(block.shared_expert_gate.weight.double() @ x[t].double()) * shared
            block.shared_expert.float()
        outs.append(y)
        chosen.append(e)
    return torch.stack(outs).float(), torch.stack(chosen)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("norm", [False, True])
def test_block_matches_per_token_reference_and_records_routes(arch: str, norm: bool) -> None:
    block = _block(arch, norm)
    x = torch.randn(17, 32, generator=torch.Generator().manual_seed(1))
    routes = RouteCapture(17, 2, 3)
    with _ctx(17, routes) as ctx:
        out = block(x, ctx)
    want, want_ids = _reference(block, x)
    assert (out - want).abs().max().item() < 1e-5
    assert routes.ids.dtype == torch.int16
    assert torch.equal(routes.ids[:, 1].long(), want_ids)  # recorded in this block's MoE slot, sorted


@pytest.mark.parametrize("n", [1, 3, 8])
def test_decode_sized_batches(n: int) -> None:
    block = _block("Qwen3MoeForCausalLM", True)
    x = torch.randn(n, 32, generator=torch.Generator().manual_seed(2))
    with _ctx(n, None) as ctx:
        out = block(x, ctx)
    assert (out - _reference(block, x)[0]).abs().max().item() < 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_forced_weights_are_live_router_probs(arch: str) -> None:
    block = _block(arch, norm_topk_prob=True)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(3))
    free = RouteCapture(9, 2, 3)
    with _ctx(9, free) as ctx:
        block(x, ctx)
    # force the *lowest*-probability experts for odd tokens (never top-k), free routing for the rest
    probs = torch.softmax(x @ block.router.weight.T, dim=-1)
    forced_ids = torch.zeros(9, 2, 3, dtype=torch.long)
    forced_ids[:, 1] = torch.topk(probs, 3, largest=False).indices
    mask = torch.arange(9) % 2 == 1
    routes = RouteCapture(9, 2, 3, forced_ids=forced_ids, forced_mask=mask)
    with _ctx(9, routes) as ctx:
        out = block(x, ctx)
    expected_ids = torch.where(mask[:, None], forced_ids[:, 1], free.ids[:, 1].long())
    assert torch.equal(routes.ids[:, 1].long(), expected_ids)
    want, _ = _reference(block, x, expected_ids)
    assert (out - want).abs().max().item() < 1e-5


def test_forcing_the_free_routes_is_bitwise_identical() -> None:
    block = _block("Qwen2MoeForCausalLM")
    x = torch.randn(11, 32, generator=torch.Generator().manual_seed(4))
    free = RouteCapture(11, 2, 3)
    with _ctx(11, free) as ctx:
        out = block(x, ctx)
    forced = RouteCapture(11, 2, 3, forced_ids=free.ids.long(), forced_mask=torch.ones(11, dtype=torch.bool))
    with _ctx(11, forced) as ctx:
        out2 = block(x, ctx)
    assert torch.equal(out, out2) and torch.equal(free.ids[:, 1], forced.ids[:, 1])


def test_forced_ids_are_not_validated_by_the_model() -> None:
    """Documented contract: the engine validates forced ids. Here, an out-of-range id is not
    caught politely (a raw indexing error on CPU; a device assert on CUDA) and a duplicated
    id silently counts the expert twice."""
    block = _block("Qwen3MoeForCausalLM", norm_topk_prob=True)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(5))
    bad = torch.zeros(2, 2, 3, dtype=torch.long)
    bad[0, 1] = torch.tensor([0, 1, block.num_experts])
    everyone = torch.ones(2, dtype=torch.bool)
    with pytest.raises((IndexError, RuntimeError)), \
            _ctx(2, RouteCapture(2, 2, 3, forced_ids=bad, forced_mask=everyone)) as ctx:
        block(x, ctx)
    dup = torch.zeros(2, 2, 3, dtype=torch.long)
    dup[:, 1] = torch.tensor([4, 4, 2])
    routes = RouteCapture(2, 2, 3, forced_ids=dup, forced_mask=torch.ones(2, dtype=torch.bool))
    with _ctx(2, routes) as ctx:
        out = block(x, ctx)
    assert (out - _reference(block, x, dup[:, 1])[0]).abs().max().item() < 1e-5


def test_host_ids_from_the_slots_equal_the_recorded_ids() -> None:
    # Layers that wrote into their slots: host_ids is the buffer cast (int16, [T, layers, k], C order),
    # the same values as the stacked ids; a layer recording its own tensor falls back to the stack.
    g = torch.Generator().manual_seed(3)
    vals = torch.randint(0, 6, (3, 5, 2), generator=g)
    slotted = RouteCapture(5, 3, 2)
    for m in range(3):
        s = slotted.slot(m)
        s.copy_(vals[m])
        slotted.record(m, s)
    host = slotted.host_ids()
    assert slotted._ids is None  # the buffer's cast, not the stack
    assert host.dtype.name == "int16" and host.shape == (5, 3, 2) and host.flags.c_contiguous
    assert (host == vals.permute(1, 0, 2).numpy()).all() and (host == slotted.ids.numpy()).all()
    mixed = RouteCapture(5, 3, 2)
    for m in range(3):
        s = mixed.slot(m)
        s.fill_(9)
        mixed.record(m, vals[m].clone() if m == 2 else s)
    host = mixed.host_ids()
    assert mixed._ids is not None and (host[:, 2] == vals[2].numpy()).all() and (host[:, :2] == 9).all()
