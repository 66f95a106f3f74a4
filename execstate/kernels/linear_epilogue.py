"""The prefill's dense linears with the pass after them as their epilogue: the q/k/v projection
with QK-norm, RoPE and the K/V cache store, the o-proj with the residual add and the next
RMSNorm (C: ``linear_qkv`` / ``linear_add_norm``; ``linear_epilogue`` in ``csrc/gemm_packed.c``
and ``csrc/gemm_bf16dot.c``, the epilogues ``es_qkv_rope_rows`` / ``es_add_rms_rows`` in
``csrc/fused.c``).

``linear_qkv_rope_to_cache`` returns what the linear (``gemm.linear`` for fp32 weights,
``gemm_bf16dot.linear_bf16dot`` for the bf16-arithmetic format), ``y.add_(bias)`` and
``fused.qkv_rope_to_cache`` give, bit for bit, and stores the same k/v rows: each thread
multiplies its own rows a block at a time into a buffer that stays in its cache and runs the
split, QK-norm, RoPE and store on that block at once, so the ``[T, (nh + 2 nkv) d]`` product
never goes through memory and the split needs no team of its own. ``linear_add_rms_norm`` is
the same for the o-proj and ``fused.add_rms_norm`` after it.
"""

from __future__ import annotations

import torch

from execstate.kernels import gemm_bf16dot
from execstate.kernels.ext import F32, LIB, is_f32_cpu, lib, require, sync_threads
from execstate.kernels.fused import check_rope
from execstate.kernels.gemm import MIN_PACKED_ROWS, PACKED

BF16 = torch.bfloat16


def use_linear_epilogue(rows: int, weight: torch.Tensor, bias: torch.Tensor | None, bf16dot: bool) -> bool:
    """Whether the kernels with an epilogue take a projection of ``rows`` rows: at least
    ``MIN_PACKED_ROWS`` (a prefill's, not a decode's), a 2-D contiguous CPU ``weight`` that they
    multiply here (fp32 on AVX-512; bf16 for ``bf16dot`` on AVX512-BF16, not the emulation),
    ``bias`` None or fp32. (The input rows must be 2-D fp32 contiguous: ``fused.use_rows``.)"""
    if LIB is None or rows < MIN_PACKED_ROWS or weight.dim() != 2 or not (weight.is_cpu and weight.is_contiguous()):
        return False
    if bias is not None and not (is_f32_cpu(bias) and bias.dim() == 1):
        return False
    return gemm_bf16dot.NATIVE and weight.dtype is BF16 if bf16dot else PACKED and weight.dtype is F32


def linear_qkv_rope_to_cache(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, bf16dot: bool,
                             cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None,
                             k_norm: torch.Tensor | None, eps: float, num_heads: int, head_dim: int,
                             k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``qkv_rope_to_cache(x @ weight.T (+ bias), ...)`` without the product tensor: ``x [T, K]``,
    ``weight [(nh + 2 nkv) d, K]`` (fp32, or bf16 multiplied in the bf16 dot order when
    ``bf16dot``), ``bias [(nh + 2 nkv) d]`` or None; token t's k and v rows stored at row
    ``slots[t]`` of ``k_cache, v_cache [S, nkv, d]``; returns ``q [T, nh, d]``. ``ValueError``
    for inputs that do not fit (nothing written); ``use_linear_epilogue`` says whether the kernel runs."""
    _check_linear(x, weight, bias, bf16dot)
    require(k_cache, "k_cache", 3)
    require(v_cache, "v_cache", 3)
    require(slots, "slots", 1, torch.int64)
    t, k = x.shape
    n = weight.shape[0]
    num_slots, num_kv_heads, d = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape) or d != head_dim:
        raise ValueError(f"linear_qkv: k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)} "
                         f"for heads of {head_dim}")
    check_rope(t, n, cos, sin, q_norm, k_norm, num_heads, num_kv_heads, head_dim)
    if slots.shape[0] != t:
        raise ValueError(f"linear_qkv: {slots.shape[0]} slots for {t} tokens")
    q = torch.empty((t, num_heads, head_dim), dtype=F32)
    if t:
        sync_threads()
        lib().linear_qkv(bf16dot, x.data_ptr(), weight.data_ptr(), t, k, 0 if bias is None else bias.data_ptr(),
                         cos.data_ptr(), sin.data_ptr(), 0 if q_norm is None else q_norm.data_ptr(),
                         0 if k_norm is None else k_norm.data_ptr(), float(eps), q.data_ptr(), k_cache.data_ptr(),
                         v_cache.data_ptr(), slots.data_ptr(), num_slots, num_heads, num_kv_heads, head_dim)
    return q


def linear_add_rms_norm(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, bf16dot: bool,
                        x: torch.Tensor, norm: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused.add_rms_norm(x, a @ weight.T (+ bias), norm, eps)`` without the product tensor:
    ``(s, rms_norm(s, norm, eps))`` with ``s = x + (a @ weight.T + bias)``, ``a [T, K]``,
    ``weight [H, K]`` (fp32, or bf16 multiplied in the bf16 dot order when ``bf16dot``), ``x [T, H]``,
    ``bias, norm [H]``; both new tensors, the same bits. ``ValueError`` for inputs that do not fit."""
    _check_linear(a, weight, bias, bf16dot)
    require(x, "x", 2)
    require(norm, "norm", 1)
    t, k = a.shape
    h = weight.shape[0]
    if tuple(x.shape) != (t, h) or norm.shape[0] != h:
        raise ValueError(f"linear_add_rms_norm: x {tuple(x.shape)}, norm {tuple(norm.shape)} for {t} rows of {h}")
    s, out = torch.empty((t, h), dtype=F32), torch.empty((t, h), dtype=F32)
    if t:
        sync_threads()
        lib().linear_add_norm(bf16dot, a.data_ptr(), weight.data_ptr(), t, k, 0 if bias is None else bias.data_ptr(),
                              x.data_ptr(), norm.data_ptr(), s.data_ptr(), out.data_ptr(), h, float(eps))
    return s, out


def _check_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, bf16dot: bool) -> None:
    require(x, "x", 2)
    require(weight, "weight", 2, BF16 if bf16dot else F32)
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"linear: x has {x.shape[1]} features, weight expects {weight.shape[1]}")
    if bias is not None:
        require(bias, "bias", 1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"linear: bias of {bias.shape[0]} for {weight.shape[0]} outputs")
