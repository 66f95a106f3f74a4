"""The kernels of the weight formats that have their own (``weight_format.py``), one dispatching call each.

A module whose matrix has a ``WeightFormat`` (``Linear.weight_format``, ``SparseMoE.weight_format``,
``CausalLM.head_format``) multiplies through ``linear``/``moe`` here; a module without one keeps
the dtype dispatch of the fp32 / bf16-weight kernels (``gemm.py``, ``gemm_bf16.py``).
"""

from __future__ import annotations

import torch

from execstate.kernels.gemm_bf16dot import linear_bf16dot, moe_bf16dot
from execstate.kernels.gguf_blocks import linear_gguf, moe_gguf
from execstate.kernels.weight_format import WeightFormat

__all__ = ["WeightFormat", "linear", "moe"]


def linear(x: torch.Tensor, weight: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """``x [M, K] @ W.T`` for the matrix ``weight`` stored in ``fmt`` -> new fp32 ``[M, N]``
    (``ValueError`` for input the format's kernel does not take)."""
    if fmt is WeightFormat.BF16_DOT:
        return linear_bf16dot(x, weight)
    if fmt.quantized:
        return linear_gguf(x, weight, fmt)
    raise ValueError(f"formats.linear: {fmt.name} weights take the dtype-dispatched kernels")


def moe(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
        fmt: WeightFormat) -> torch.Tensor:
    """``gemm.moe``'s contract with both expert tensors stored in ``fmt``."""
    if fmt is WeightFormat.BF16_DOT:
        return moe_bf16dot(x, ids, weights, w_gate_up, w_down)
    if fmt.quantized:
        return moe_gguf(x, ids, weights, w_gate_up, w_down, fmt)
    raise ValueError(f"formats.moe: {fmt.name} weights take the dtype-dispatched kernels")
