"""fp32 linear and the fused MoE expert block (C: ``dot_rows``, ``moe_f32``; for many rows on
AVX-512 CPUs the register-blocked ``gemm_packed.c``: ``linear_packed``, ``moe_packed``).

Numerics (see ``csrc/module.c``): deterministic and batch-invariant; not bitwise equal to torch's
MKL path. The packed kernels compute every output element bit for bit as ``dot_rows`` does, so
which kernel a call takes (by its row count) never changes a result: a row alone equals the
same row in a batch of any size. Use ``use_linear``/``use_moe`` to decide whether a call should take the kernel
path; otherwise use torch.
"""

from __future__ import annotations

import torch

from execstate.kernels.ext import F32, LIB, available, is_f32_cpu, lib, require, sync_threads

# Rows up to which the streaming kernel is used: `execstate bench kernels` measured it
# 1.1-1.8x faster than torch's GEMM at 32 rows, 0.9-1.4x at 64 (2 Zen cores).
MAX_LINEAR_ROWS = 32
# Tokens up to which the fused MoE kernel is used: measured 2.8-3x faster than torch's
# expert loop at 32 tokens, 1.75-2x at 64 (8 experts, top-2).
MAX_MOE_TOKENS = 64
# Whether the AVX-512 packed kernels run here (else calls above the limits use torch).
PACKED: bool = LIB is not None and hasattr(LIB, "packed_available") and bool(LIB.packed_available())
# Rows from which linear takes the packed kernel (streaming weights from DRAM, 1 thread,
# CPU time: dot_rows 155 vs packed 157 us at 8 rows, 305 vs 206 at 16; Zen 5).
MIN_PACKED_ROWS = 12


def use_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear(x, weight)`` applies and is the faster path (fp32, CPU; few rows, or
    any number where the packed kernel runs)."""
    return (
        LIB is not None
        and x.dtype is F32
        and weight.dtype is F32
        and x.dim() == 2
        and weight.dim() == 2
        and (x.shape[0] <= MAX_LINEAR_ROWS or PACKED)
        and x.shape[1] == weight.shape[1]
        and x.is_cpu
        and weight.is_cpu
        and x.is_contiguous()
        and weight.is_contiguous()
    )


def linear_if_small(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """``linear(x, weight)`` when ``use_linear(x, weight)``, else ``None`` (run torch instead).

    The model's hot path: one set of checks, no exceptions, ~3 us of Python per call.
    """
    if not use_linear(x, weight):
        return None
    m, n = x.shape[0], weight.shape[0]
    y = torch.empty((m, n), dtype=F32)
    if m and n:
        torch.get_num_threads()  # sync_threads(), inlined
        fn = LIB.linear_packed if PACKED and m >= MIN_PACKED_ROWS else LIB.linear
        fn(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, x.shape[1], n)
    return y


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T`` -> new ``[M, N]``; fp32 CPU contiguous tensors only."""
    require(x, "x", 2)
    require(weight, "weight", 2)
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: x has {x.shape[1]} features, weight expects {weight.shape[1]}")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=torch.float32)
    if m and n:
        sync_threads()
        fn = lib().linear_packed if PACKED and m >= MIN_PACKED_ROWS else lib().linear
        fn(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, k, n)
    return y


def use_moe(x: torch.Tensor, w_gate_up: torch.Tensor) -> bool:
    """Whether the fused MoE kernel applies (fp32 CPU, at most ``MAX_MOE_TOKENS`` tokens, or
    any number where the packed kernel runs)."""
    return available() and x.dim() == 2 and (x.shape[0] <= MAX_MOE_TOKENS or PACKED) \
        and is_f32_cpu(x) and is_f32_cpu(w_gate_up)


def moe(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
        w_down: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))``, ``e = ids[t, j]``.

    ``x [T, H]``, ``ids`` int64 ``[T, k]`` (each in ``[0, E)``, else ``ValueError``),
    ``weights`` fp32 ``[T, k]``, ``w_gate_up [E, 2I, H]`` (gate rows first),
    ``w_down [E, H, I]``. Per-token slot results are summed over ``j`` in order. Above
    ``MAX_MOE_TOKENS`` tokens (where ``PACKED``) the packed kernel runs: same result, bit for bit.
    """
    t, h, e, i = moe_sizes("moe", x, ids, weights, w_gate_up, w_down)
    out = torch.empty((t, h), dtype=torch.float32)
    if t:
        sync_threads()
        fn = lib().moe_packed if PACKED and t > MAX_MOE_TOKENS else lib().moe
        fn(x.data_ptr(), ids.data_ptr(), weights.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(), out.data_ptr(), t,
           ids.shape[1], e, h, i)
    return out


def moe_sizes(name: str, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
              w_down: torch.Tensor, w_dtype: torch.dtype = F32) -> tuple[int, int, int, int]:
    """``(T, H, E, I)`` of a fused-MoE call after checking every argument (``ValueError`` naming
    ``name`` and the argument); the expert weights must be ``w_dtype``."""
    require(x, "x", 2)
    require(weights, "weights", 2)
    require(w_gate_up, "w_gate_up", 3, w_dtype)
    require(w_down, "w_down", 3, w_dtype)
    if ids.dtype != torch.int64 or ids.device.type != "cpu" or not ids.is_contiguous() or ids.dim() != 2:
        raise ValueError(f"{name}: ids must be contiguous int64 [T, k] on CPU, got {ids.dtype} {tuple(ids.shape)}")
    t, h = x.shape
    e, two_i, h2 = w_gate_up.shape
    i = two_i // 2
    if h2 != h or two_i % 2 or tuple(w_down.shape) != (e, h, i):
        raise ValueError(f"{name}: inconsistent shapes x {tuple(x.shape)}, w_gate_up {tuple(w_gate_up.shape)}, "
                         f"w_down {tuple(w_down.shape)}")
    if ids.shape[0] != t or tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(f"{name}: ids {tuple(ids.shape)} and weights {tuple(weights.shape)} must both be [{t}, k]")
    return t, h, e, i
