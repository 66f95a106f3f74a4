"""The whole-layer decode path: a decode step's layers as one C call each.

``decode_layers(layers, weights, x, cos, sin, ctx)`` runs every decoder layer of a step through
``kernels/decode_layer.py`` when the step and the model qualify, and returns None otherwise
(the caller runs the per-op path):

- the step: the model is on the CPU kernels and ``ctx.attention`` gives ``decode_tables()``
  (every span a decode, at most ``MAX_LINEAR_ROWS`` of them, an fp32 or bf16 pool);
- the model: every layer on the CPU with fp32 vectors and fp32 or bf16 matrices (bf16 weights,
  ``model/bf16_weights.py``) or matrices in a kernel format of their own (bf16 arithmetic, GGUF
  blocks: ``model/weight_formats.py``), a dense SwiGLU MLP or a ``SparseMoE``, no ``clip_qkv``, and
  QK-norm absent or per head (``DecodeWeights.build`` says which layer does not qualify).

A dense layer is one C call. A MoE layer without a shared expert is one C call too: routing
(``kernels/routing.py``'s order, which ``SparseMoE.route`` uses on the kernels), forced routes of a
replay, and the experts run inside it; the routes it returns are recorded in ``ctx.routes`` as
``SparseMoE.route`` records them. A MoE layer with a shared expert is one C call up to the router
logits, then the module's own routing and experts. Either way routes and replay behave exactly
as on the per-op path, and results are bitwise equal to it (same kernels, same order).

The layers' checked weight pointers are built once and kept on the model
(``CausalLM.decode_weights``, passed here as ``weights``: called only when a step qualifies);
``CausalLM`` drops them whenever its weights may be replaced (``loader.load_hf_weights``,
``use_cpu_kernels``, ``to``/``_apply``). Weight updates copy in place, which keeps the pointers
valid. This module knows the layers (``decoder_layer.py``), not the model: ``transformer.py``
imports it, never the other way round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import cast

import torch

from execstate.kernels import decode_layer as kern
from execstate.model.context import StepContext
from execstate.model.decoder_layer import DecoderLayer
from execstate.model.layers import GatedMLP
from execstate.model.moe import SparseMoE
from execstate.model.weight_formats import decode_formats, format_of, matrices_reason


class DecodeWeights:
    """Every layer's ``LayerWeights`` (``layers``), or why the model cannot take the path (``reason``)."""

    def __init__(self, layers: list[kern.LayerWeights] | None, reason: str | None) -> None:
        self.layers, self.reason = layers, reason

    @classmethod
    def build(cls, layers: Sequence[DecoderLayer]) -> DecodeWeights:
        out = []
        for i, layer in enumerate(layers):
            reason = _unsupported(layer)
            if reason is not None:
                return cls(None, f"layer {i}: {reason}")
            out.append(_layer_weights(layer))
        return cls(out, None)


def _unsupported(layer: DecoderLayer) -> str | None:
    a = layer.attn
    if a.clip_qkv is not None:
        return "clip_qkv"
    if (a.q_norm is None) != (a.k_norm is None):
        return "QK-norm on q or k only"
    if a.q_norm is not None and a.k_norm is not None and not (
            a.per_head_norm and a.q_norm.eps == a.k_norm.eps == a.eps):
        return "QK-norm over whole q/k rows, or its own epsilon"
    if not layer.input_norm.eps == layer.post_attn_norm.eps == a.eps:
        return "norm epsilons differ"
    if not isinstance(layer.mlp, GatedMLP | SparseMoE):
        return f"MLP {type(layer.mlp).__name__}"
    params = list(layer.parameters())
    if not all(p.is_cpu for p in params):
        return "not on the CPU"
    if any(p.dtype != torch.float32 for p in params if p.dim() < 2):
        return "norm weights or biases not fp32"
    return matrices_reason(layer)  # each in its kernel format (model/weight_formats.py)


def experts_in_call(layer: DecoderLayer) -> bool:
    """Whether the layer's MoE block runs inside its whole-layer call (routing and experts in C):
    a ``SparseMoE`` without a shared expert. Otherwise the call stops at the router logits."""
    return isinstance(layer.mlp, SparseMoE) and layer.mlp.shared_expert is None


def _layer_weights(layer: DecoderLayer) -> kern.LayerWeights:
    a, mlp = layer.attn, layer.mlp
    formats = decode_formats(layer)
    experts = experts_in_call(layer)
    if experts and (f := format_of(mlp)) is not None:
        formats["w_gate_up"] = formats["w_down"] = f
    return kern.layer_weights(
        layer.input_norm.weight, a.qkv_proj.weight, a.qkv_proj.bias,
        None if a.q_norm is None else a.q_norm.weight, None if a.k_norm is None else a.k_norm.weight,
        a.o_proj.weight, a.o_proj.bias, layer.post_attn_norm.weight,
        num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, eps=a.eps,
        w_router=None if isinstance(mlp, GatedMLP) else mlp.router.weight,
        w_gate_up=mlp.gate_up_proj.weight if isinstance(mlp, GatedMLP) else mlp.w_gate_up if experts else None,
        w_down=mlp.down_proj.weight if isinstance(mlp, GatedMLP) else mlp.w_down if experts else None,
        formats=formats, top_k=mlp.top_k if experts and isinstance(mlp, SparseMoE) else 0,
        norm_topk=bool(experts and mlp.norm_topk_prob),
    )


def decode_layers(layers: Sequence[DecoderLayer], weights_of: Callable[[], DecodeWeights], x: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, ctx: StepContext) -> torch.Tensor | None:
    """Every layer of a qualifying decode step (``x [T, H]`` updated in place and returned), or None."""
    tables_of = getattr(ctx.attention, "decode_tables", None)
    if tables_of is None or x.dtype != torch.float32:
        return None
    weights = weights_of()
    if weights.layers is None:
        return None
    tables = tables_of()
    if tables is None:
        return None
    n = x.shape[0]
    timers = ctx.timers  # the layer calls' time and the kernels' phases (model/step_timers.py)
    step = kern.decode_step(x, cos.reshape(n, -1), sin.reshape(n, -1), tables,
                            timers.kernel_args() if timers is not None else (0, 0, 0))
    h = torch.empty_like(x)
    logits: torch.Tensor | None = None
    team, routes = ctx.team, ctx.routes  # team or one thread per call (kernels/team.py); R3 capture/replay
    routed: tuple[torch.Tensor, torch.Tensor] | None = None  # (ids, weights) of the MoE calls, below
    t0 = timers.now() if timers is not None else 0.0
    for i, (layer, w) in enumerate(zip(layers, weights.layers, strict=True)):
        if team is not None:
            team.before_call((i, n))
            t_call = time.perf_counter()
        if w.top_k:  # routing and experts in the call; the routes recorded as SparseMoE.route does
            m = cast(SparseMoE, layer.mlp).moe_index  # top_k: an MoE layer
            forced = routes.forced(m) if routes is not None else None
            if forced is not None:
                forced = (forced[0].to(device="cpu", dtype=torch.uint8).contiguous(),
                          forced[1].to(device="cpu", dtype=torch.int64).contiguous())
            # the routing weights, and the ids nothing records: one pair of outputs for every MoE layer
            # of the step (two allocations a layer cost ~10 us of cold dispatch)
            if routed is None or routed[0].shape[1] != w.top_k:
                routed = torch.empty((n, w.top_k), dtype=torch.int64), torch.empty((n, w.top_k))
            ids = routes.slot(m) if routes is not None else routed[0]
            kern.run_layer(i, w, step, ids_out=ids, wts_out=routed[1], forced=forced)
            if routes is not None:
                routes.record(m, ids)
        elif w.num_experts:  # the call stops at the router logits; the module routes and runs its experts
            if logits is None or logits.shape[1] != w.num_experts:
                logits = torch.empty((n, w.num_experts), dtype=torch.float32)
            kern.run_layer(i, w, step, h, logits)
        else:
            kern.run_layer(i, w, step)
        if team is not None:
            team.after_call((i, n), time.perf_counter() - t_call)
        if w.num_experts and not w.top_k:
            if timers is not None:
                timers.add("layers", t0)
            x.add_(layer.mlp(h, ctx, logits=logits))  # charges "routing" and "experts" itself
            if timers is not None:
                t0 = timers.now()
    if timers is not None:
        timers.add("layers", t0)
    return x
