"""Which kernel format each matrix of a model is multiplied in (``kernels/formats.py``).

The modules that hold matrices carry a ``weight_format`` (``Linear``, ``SparseMoE`` for both
expert tensors) and ``CausalLM.head_format`` for the LM head; ``None`` means the dtype decides
(fp32, or bf16 widened to fp32: the kernels of ``gemm.py`` / ``gemm_bf16.py``). This module sets
them for a numerics mode and reads them for the whole-layer decode path.

bf16 arithmetic (``use_bf16_arithmetic``; the engine's ``compute_dtype="bfloat16"``): after
``store_weights_bf16``, every matmul whose output feeds the residual stream or the logits runs in
``BF16_DOT`` (its input rows rounded to bf16, ``vdpbf16ps``, fp32 sums: q/k/v and output
projections, dense MLPs, the MoE experts, the shared expert and the LM head). The MoE router and
the shared-expert gate stay in fp32 arithmetic on their bf16 weights (``None``): routing
decisions are not rounded further. Attention, norms, RoPE, SwiGLU, the KV cache and the residual
stream stay fp32.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn

from execstate.kernels.weight_format import WeightFormat
from execstate.model.decoder_layer import DecoderLayer
from execstate.model.layers import Linear
from execstate.model.moe import SparseMoE


class LanguageModel(Protocol):
    """What this module sets on a ``CausalLM`` (which imports it)."""

    head_format: WeightFormat | None

    def modules(self) -> Iterator[nn.Module]: ...

    def drop_decode_weights(self) -> None: ...


def use_bf16_arithmetic(model: LanguageModel) -> None:
    """Put every matmul of ``model`` (a ``CausalLM``: this module sits below ``transformer.py``)
    but the routers and shared-expert gates in ``BF16_DOT`` (see the module docstring).
    The matrices must already be bf16 (``CausalLM.store_weights_bf16``)."""
    gates = set()
    for module in model.modules():
        if isinstance(module, SparseMoE):
            gates.add(id(module.router))
            if module.shared_expert_gate is not None:
                gates.add(id(module.shared_expert_gate))
    for module in model.modules():
        if isinstance(module, Linear) and id(module) not in gates or isinstance(module, SparseMoE):
            module.weight_format = WeightFormat.BF16_DOT
    model.head_format = WeightFormat.BF16_DOT
    model.drop_decode_weights()


def format_of(module: nn.Module) -> WeightFormat | None:
    """The module's ``weight_format`` (``None``: by dtype)."""
    return getattr(module, "weight_format", None)


def decode_formats(layer: DecoderLayer) -> dict[str, WeightFormat]:
    """The kernel formats of a decoder layer's matrices that have one, by ``kernels.decode_layer``
    name (``w_qkv``, ``w_o``, ``w_router``, ``w_gate_up``, ``w_down``)."""
    attn, mlp = layer.attn, layer.mlp
    modules = {"w_qkv": attn.qkv_proj, "w_o": attn.o_proj}
    if isinstance(mlp, SparseMoE):
        modules["w_router"] = mlp.router
    else:
        modules["w_gate_up"], modules["w_down"] = mlp.gate_up_proj, mlp.down_proj
    return {name: f for name, m in modules.items() if (f := format_of(m)) is not None}


def matrices_reason(layer: nn.Module) -> str | None:
    """Why a decoder layer's matrices cannot take the whole-layer decode path, or None: those with
    a ``weight_format`` must be stored as it says; the others all fp32 or all bf16."""
    formatted = {id(m.weight): f for m in layer.modules() if (f := format_of(m)) is not None and hasattr(m, "weight")}
    plain = set()
    for name, p in layer.named_parameters():
        if p.dim() < 2:
            continue
        f = formatted.get(id(p))
        if f is None and isinstance(layer.mlp, SparseMoE) and name.startswith("mlp.w_"):
            f = format_of(layer.mlp)  # the experts run in the MoE call, outside the layer's C call
        if f is None:
            plain.add(p.dtype)
        elif p.dtype != f.storage(1, 32)[1]:
            return f"{name} is {p.dtype}, not stored as {f.name}"
    if len(plain) > 1 or not plain <= {torch.float32, torch.bfloat16}:
        return "matrices not all fp32 or all bf16"
    return None
