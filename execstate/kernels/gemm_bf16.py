"""Few-row linear and the fused MoE expert block with bf16 weights (C: ``csrc/gemm_bf16.c``).

Weights are bf16 (half the bytes of fp32; decode streams every weight once per step, so it is
bound by weight bytes); activations, outputs and every sum are fp32. The C code widens each
weight exactly (bf16 is the top half of an fp32) and runs the same FMA sequence as the fp32
kernels, so ``linear_bf16(x, w)`` equals ``gemm.linear(x, w.float())`` bit for bit, and
likewise ``moe_bf16``: deterministic and batch-invariant (``csrc/module.c``). Many-row calls on
AVX-512 CPUs take the packed kernels (``csrc/gemm_packed.c``: each block of weight rows widened
once per call, then the fp32 register-blocked kernel), and calls of 4+ rows the AVX-512
few-row kernel (``csrc/gemm_bf16_pairs.c``: weights widened in registers into both halves of
a 16-lane vector, two rows per vector), with the same results bit for bit.
"""

from __future__ import annotations

import torch

from execstate.kernels.ext import F32, LIB, available, is_f32_cpu, lib, require, sync_threads
from execstate.kernels.gemm import MAX_MOE_TOKENS, MIN_PACKED_ROWS, PACKED, moe_sizes

BF16 = torch.bfloat16
# Provenance kernel set of an engine with bf16 weights (fp32 activations, KV and sums; every
# row count on these kernels: execstate/model/bf16_weights.py).
KERNEL_SET_BF16 = "cpu-avx2-v3-bf16w"  # v3: the routing of KERNEL_SET v2
# Rows up to which the bf16 kernel runs where the packed kernels do not (beyond, torch's bf16
# GEMM: measured faster than widening the weight for torch's fp32 GEMM, 2 Zen cores).
MAX_LINEAR_ROWS_BF16 = 32


def is_bf16_cpu(t: torch.Tensor) -> bool:
    return t.dtype is BF16 and t.is_cpu and t.is_contiguous()


def use_linear_bf16(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear_bf16(x, weight)`` applies (fp32 rows, few or any number where the packed
    kernels run; bf16 weight; CPU, contiguous)."""
    return (
        LIB is not None
        and x.dtype is F32
        and weight.dtype is BF16
        and x.dim() == 2
        and weight.dim() == 2
        and (x.shape[0] <= MAX_LINEAR_ROWS_BF16 or PACKED)
        and x.shape[1] == weight.shape[1]
        and x.is_cpu
        and weight.is_cpu
        and x.is_contiguous()
        and weight.is_contiguous()
    )


def linear_bf16_if_small(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """``linear_bf16(x, weight)`` when ``use_linear_bf16`` accepts the call, else ``None``."""
    if not use_linear_bf16(x, weight):
        return None
    m, n = x.shape[0], weight.shape[0]
    y = torch.empty((m, n), dtype=F32)
    if m and n:
        torch.get_num_threads()  # sync_threads(), inlined
        fn = LIB.linear_packed_bf16 if PACKED and m >= MIN_PACKED_ROWS else LIB.linear_bf16
        fn(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, x.shape[1], n)
    return y


def linear_bf16(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ float(weight[N, K]).T`` -> new fp32 ``[M, N]``; ``x`` fp32, ``weight`` bf16."""
    require(x, "x", 2)
    require(weight, "weight", 2, BF16)
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_bf16: x has {x.shape[1]} features, weight expects {weight.shape[1]}")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=F32)
    if m and n:
        sync_threads()
        fn = lib().linear_packed_bf16 if PACKED and m >= MIN_PACKED_ROWS else lib().linear_bf16
        fn(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, k, n)
    return y


def use_moe_bf16(x: torch.Tensor, w_gate_up: torch.Tensor) -> bool:
    """Whether ``moe_bf16`` applies (fp32 activations, bf16 experts, at most ``MAX_MOE_TOKENS``
    tokens or any number where the packed kernels run)."""
    return available() and x.dim() == 2 and (x.shape[0] <= MAX_MOE_TOKENS or PACKED) \
        and is_f32_cpu(x) and is_bf16_cpu(w_gate_up)


def moe_bf16(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
             w_down: torch.Tensor) -> torch.Tensor:
    """``gemm.moe`` with bf16 ``w_gate_up [E, 2I, H]`` and ``w_down [E, H, I]``; fp32 ``[T, H]`` out."""
    t, h, e, i = moe_sizes("moe_bf16", x, ids, weights, w_gate_up, w_down, BF16)
    out = torch.empty((t, h), dtype=F32)
    if t:
        sync_threads()
        fn = lib().moe_packed_bf16 if PACKED and t > MAX_MOE_TOKENS else lib().moe_bf16
        fn(x.data_ptr(), ids.data_ptr(), weights.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(),
                       out.data_ptr(), t, ids.shape[1], e, h, i)
    return out
