"""Linear and the fused MoE expert block with bf16 arithmetic (C: ``csrc/gemm_bf16dot.c``, and
``csrc/gemm_bf16dot_emu.c`` where the CPU lacks AVX512-BF16).

The numerics of the engine's bf16 mode (``compute_dtype="bfloat16"``): weights bf16; each
matmul's input rows rounded to bf16 (round-to-nearest-even, per element: independent of the
batch); products by ``vdpbf16ps`` with fp32 sums in one fixed order (the "bf16 dot order" of
``gemm_bf16dot.c``: 16 lanes over 32-column chunks in order, then a fixed lane tree); fp32 out.
One kernel serves every row count (decode, prefill, MoE slots), so a row alone equals the same
row in any batch, bit for bit. Without AVX512-BF16 the same order runs on fp32 FMAs (``EMU``):
equal bits except where ``vdpbf16ps`` flushes a subnormal, hence its own kernel set.
"""

from __future__ import annotations

import torch

from execstate.kernels.ext import F32, LIB, available, is_f32_cpu, lib, require, sync_threads
from execstate.kernels.gemm import moe_sizes

BF16 = torch.bfloat16
# Whether the AVX512-BF16 kernels run here; else the AVX2 emulation (when the kernels exist).
NATIVE: bool = LIB is not None and bool(LIB.bf16dot_available())
# Provenance kernel sets of the bf16 mode: vdpbf16ps, and its FMA emulation (same order).
KERNEL_SET_BF16_DOT = "cpu-avx512bf16-v2"  # v2: the routing of KERNEL_SET v2
KERNEL_SET_BF16_DOT_EMU = "cpu-avx2-bf16emu-v2"


def kernel_set() -> str:
    """The kernel set the bf16 mode runs on this CPU."""
    return KERNEL_SET_BF16_DOT if NATIVE else KERNEL_SET_BF16_DOT_EMU


def _entry(name: str) -> str:
    """The C entry ``name`` (AVX512-BF16) or its emulation ``name_emu``, as this CPU allows."""
    return name if NATIVE else f"{name}_emu"


def use_bf16dot(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear_bf16dot(x, weight)`` applies (2-D fp32 rows, bf16 weight, CPU, contiguous)."""
    return (LIB is not None and x.dtype is F32 and weight.dtype is BF16 and x.dim() == 2 and weight.dim() == 2
            and x.shape[1] == weight.shape[1] and x.is_cpu and weight.is_cpu and x.is_contiguous()
            and weight.is_contiguous())


def linear_bf16dot(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``bf16(x [M, K]) @ weight[N, K].T`` in the bf16 dot order -> new fp32 ``[M, N]``; ``x`` fp32,
    ``weight`` bf16."""
    require(x, "x", 2)
    require(weight, "weight", 2, BF16)
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_bf16dot: x has {x.shape[1]} features, weight expects {weight.shape[1]}")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=F32)
    if m and n:
        sync_threads()
        getattr(lib(), _entry("linear_bf16dot"))(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, k, n)
    return y


def use_moe_bf16dot(x: torch.Tensor, w_gate_up: torch.Tensor) -> bool:
    return available() and x.dim() == 2 and is_f32_cpu(x) and w_gate_up.dtype is BF16 and w_gate_up.is_cpu \
        and w_gate_up.is_contiguous()


def moe_bf16dot(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
                w_down: torch.Tensor) -> torch.Tensor:
    """``gemm.moe``'s contract with bf16 arithmetic: every expert matmul in the bf16 dot order (its
    input rows rounded to bf16: x for gate/up, the SwiGLU output for down); SwiGLU and the
    combine in fp32 as ``gemm.moe``."""
    t, h, e, i = moe_sizes("moe_bf16dot", x, ids, weights, w_gate_up, w_down, BF16)
    out = torch.empty((t, h), dtype=F32)
    if t:
        sync_threads()
        getattr(lib(), _entry("moe_bf16dot"))(x.data_ptr(), ids.data_ptr(), weights.data_ptr(), w_gate_up.data_ptr(),
                                              w_down.data_ptr(), out.data_ptr(), t, ids.shape[1], e, h, i)
    return out
