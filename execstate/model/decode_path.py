"""The whole-layer decode path: a decode step's layers as one C call each.

``decode_layers(layers, weights, x, cos, sin, ctx)`` runs every decoder layer of a step through
``kernels/decode_layer.py`` when the step and the model qualify, and returns None otherwise
(the caller runs the per-op path):

- the step: the model is on the CPU kernels and ``ctx.attention`` gives ``decode_tables()``
  (every span a decode, at most ``MAX_LINEAR_ROWS`` of them, fp32 pool);
- the model: every layer on the CPU with fp32 vectors and fp32 or bf16 matrices (bf16 weights,
  ``model/bf16_weights.py``) or matrices in a kernel format of their own (bf16 arithmetic, GGUF
  blocks: ``model/weight_formats.py``), a dense SwiGLU MLP or a ``SparseMoE``, no ``clip_qkv``, and
  QK-norm absent or per head (``DecodeWeights.build`` says which layer does not qualify).

A dense layer is one C call. A MoE layer is one C call up to the router logits, then the
module's own routing (softmax, top-k, forced routes, route capture: ``SparseMoE.route``) and
experts; so routes and replay behave exactly as on the per-op path. Results are bitwise
equal to the per-op kernel path (same kernels, same order).

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

import torch

from execstate.kernels import decode_layer as kern
from execstate.model.context import StepContext
from execstate.model.decoder_layer import DecoderLayer
from execstate.model.layers import GatedMLP
from execstate.model.moe import SparseMoE
from execstate.model.weight_formats import decode_formats, matrices_reason


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


def _layer_weights(layer: DecoderLayer) -> kern.LayerWeights:
    a, mlp = layer.attn, layer.mlp
    dense = isinstance(mlp, GatedMLP)
    return kern.layer_weights(
        layer.input_norm.weight, a.qkv_proj.weight, a.qkv_proj.bias,
        None if a.q_norm is None else a.q_norm.weight, None if a.k_norm is None else a.k_norm.weight,
        a.o_proj.weight, a.o_proj.bias, layer.post_attn_norm.weight,
        num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, eps=a.eps,
        w_router=None if dense else mlp.router.weight,
        w_gate_up=mlp.gate_up_proj.weight if dense else None, w_down=mlp.down_proj.weight if dense else None,
        formats=decode_formats(layer),
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
    cos2, sin2 = cos.reshape(n, -1), sin.reshape(n, -1)
    kern.check_step(x, cos2, sin2, tables)
    h = torch.empty_like(x)
    logits: torch.Tensor | None = None
    timers = ctx.timers  # the layer calls' wall time and the kernels' phases (model/step_timers.py)
    clock = timers.kernel_args() if timers is not None else (0, 0, 0)
    team = ctx.team  # team or one thread, per call (kernels/team.py)
    t0 = timers.now() if timers is not None else 0.0
    for i, (layer, w) in enumerate(zip(layers, weights.layers, strict=True)):
        if w.num_experts and (logits is None or logits.shape[1] != w.num_experts):
            logits = torch.empty((n, w.num_experts), dtype=torch.float32)
        if team is not None:
            team.before_call((i, n))
            t_call = time.perf_counter()
        if w.num_experts:
            kern.run_layer(i, w, x, cos2, sin2, tables, h, logits, timers=clock)
        else:
            kern.run_layer(i, w, x, cos2, sin2, tables, timers=clock)
        if team is not None:
            team.after_call((i, n), time.perf_counter() - t_call)
        if not w.num_experts:
            continue
        if timers is not None:
            timers.add("layers", t0)
        x.add_(layer.mlp(h, ctx, logits=logits))  # charges "routing" and "experts" itself
        if timers is not None:
            t0 = timers.now()
    if timers is not None:
        timers.add("layers", t0)
    return x
