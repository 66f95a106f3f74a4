"""Fused per-layer elementwise kernels: RMSNorm, q/k/v split + QK-norm + RoPE, SwiGLU gate, sigmoid.

At decode a layer's weights stream in a few hundred microseconds, so the dozens of small
torch ops around them (each a few microseconds of dispatch) become a large share of a
step. These wrappers replace such chains with one C call each.

Numerics: ``qkv_rope``'s rotation and copies are the same fp32 operations as the torch
path (bitwise equal); RMSNorm sums squares in 8 fp32 lanes and ``silu_mul`` uses the
kernels' vectorised exp, so those round slightly differently from torch (within 1e-6
relative). All are deterministic and per-row (batch-invariant). ``sigmoid`` computes every
element with the same operations whatever its position in the tensor (torch's vectorised
loop and its scalar tail round differently, so its result depends on the tensor's length).
"""

from __future__ import annotations

import torch

from execstate.kernels.ext import available, is_f32_cpu, lib, require, sync_threads


def use_rows(x: torch.Tensor) -> bool:
    """Whether ``x`` is a 2-D fp32 contiguous CPU tensor the fused kernels take."""
    return available() and x.dim() == 2 and is_f32_cpu(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2, -1) + eps)`` for ``x [T, H]``, ``weight [H]``."""
    require(x, "x", 2)
    require(weight, "weight", 1)
    t, h = x.shape
    if weight.shape[0] != h:
        raise ValueError(f"rms_norm: weight has {weight.shape[0]} entries for rows of {h}")
    out = torch.empty_like(x)
    if t:
        lib().rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), t, h, float(eps))
    return out


def add_rms_norm(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, rms_norm(s, weight, eps))`` with ``s = x + a`` for ``x, a [T, H]``: a pre-norm block's
    residual add and the next norm in one pass, the same bits as ``x + a`` then ``rms_norm``.
    ``s`` is written into ``a``'s storage (the caller hands over ``a``, a fresh branch output)."""
    require(x, "x", 2)
    require(a, "a", 2)
    require(weight, "weight", 1)
    t, h = x.shape
    if tuple(a.shape) != (t, h) or weight.shape[0] != h:
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)}, a {tuple(a.shape)}, weight {tuple(weight.shape)}")
    out = torch.empty_like(x)
    if t:
        ptr = a.data_ptr()
        lib().add_rms_norm(x.data_ptr(), ptr, weight.data_ptr(), ptr, out.data_ptr(), t, h, float(eps))
    return a, out


def qkv_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None,
             k_norm: torch.Tensor | None, eps: float, num_heads: int, num_kv_heads: int,
             head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split ``qkv [T, (nh + 2 nkv) d]`` (rows q | k | v) into contiguous ``q [T, nh, d]``,
    ``k, v [T, nkv, d]``; RMS-normalise each q and k head with ``q_norm``/``k_norm``
    (``[d]``, per-head norm, both or neither); rotate q and k with ``cos``/``sin``
    ``[T, d]`` in the rotate-half layout."""
    t = _check_qkv(qkv, cos, sin, q_norm, k_norm, num_heads, num_kv_heads, head_dim)
    q = torch.empty((t, num_heads, head_dim), dtype=torch.float32)
    k = torch.empty((t, num_kv_heads, head_dim), dtype=torch.float32)
    v = torch.empty((t, num_kv_heads, head_dim), dtype=torch.float32)
    if t:
        sync_threads()
        lib().qkv_rope(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), 0 if q_norm is None else q_norm.data_ptr(),
                       0 if k_norm is None else k_norm.data_ptr(), float(eps), q.data_ptr(), k.data_ptr(),
                       v.data_ptr(), t, num_heads, num_kv_heads, head_dim)
    return q, k, v


def qkv_rope_to_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None,
                      k_norm: torch.Tensor | None, eps: float, num_heads: int, head_dim: int, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``qkv_rope`` with token t's k and v rows stored at row ``slots[t]`` of the fp32 cache layers
    ``k_cache, v_cache [S, nkv, d]`` (in place: the values ``qkv_rope``'s k and v hold, bit for bit,
    without those tensors or a separate copy into the cache); returns ``q [T, nh, d]``. ``slots``:
    int64 ``[T]`` in ``[0, S)`` (else ``ValueError``, nothing written)."""
    require(k_cache, "k_cache", 3)
    require(v_cache, "v_cache", 3)
    require(slots, "slots", 1, torch.int64)
    num_slots, num_kv_heads, d = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape) or d != head_dim:
        raise ValueError(f"qkv_rope_to_cache: k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)} "
                         f"for heads of {head_dim}")
    t = _check_qkv(qkv, cos, sin, q_norm, k_norm, num_heads, num_kv_heads, head_dim)
    if slots.shape[0] != t:
        raise ValueError(f"qkv_rope_to_cache: {slots.shape[0]} slots for {t} tokens")
    q = torch.empty((t, num_heads, head_dim), dtype=torch.float32)
    if t:
        sync_threads()
        lib().qkv_rope(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), 0 if q_norm is None else q_norm.data_ptr(),
                       0 if k_norm is None else k_norm.data_ptr(), float(eps), q.data_ptr(), k_cache.data_ptr(),
                       v_cache.data_ptr(), t, num_heads, num_kv_heads, head_dim, slots.data_ptr(), num_slots)
    return q


def _check_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None,
               k_norm: torch.Tensor | None, num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """The token count of ``qkv_rope``'s inputs; ``ValueError`` when they do not fit together."""
    require(qkv, "qkv", 2)
    return check_rope(qkv.shape[0], qkv.shape[1], cos, sin, q_norm, k_norm, num_heads, num_kv_heads, head_dim)


def check_rope(t: int, width: int, cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None,
               k_norm: torch.Tensor | None, num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """``t``, for q/k/v rows of ``width`` of ``t`` tokens and their RoPE tables and QK-norm weights;
    ``ValueError`` when they do not fit together."""
    require(cos, "cos", 2)
    require(sin, "sin", 2)
    if width != (num_heads + 2 * num_kv_heads) * head_dim or head_dim % 2:
        raise ValueError(f"qkv_rope: qkv rows of {width} for {num_heads}+2x{num_kv_heads} heads of {head_dim}")
    if tuple(cos.shape) != (t, head_dim) or tuple(sin.shape) != (t, head_dim):
        raise ValueError(f"qkv_rope: cos/sin must be [{t}, {head_dim}], got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("qkv_rope: give both q_norm and k_norm or neither")
    if q_norm is not None and k_norm is not None:
        require(q_norm, "q_norm", 1)
        require(k_norm, "k_norm", 1)
        if q_norm.shape[0] != head_dim or k_norm.shape[0] != head_dim:
            raise ValueError(f"qkv_rope: per-head norm weights must have {head_dim} entries")
    return int(t)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up [T, 2I]`` (gate columns first) -> ``[T, I]``."""
    require(gate_up, "gate_up", 2)
    t, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"silu_mul: gate_up has an odd width {two_i}")
    out = torch.empty((t, two_i // 2), dtype=torch.float32)
    if t and two_i:
        lib().silu_mul(gate_up.data_ptr(), out.data_ptr(), t, two_i // 2)
    return out


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + exp(-x))`` elementwise for a contiguous fp32 CPU ``x`` of any shape (new tensor)."""
    require(x, "x", x.dim() if isinstance(x, torch.Tensor) else 1)
    out = torch.empty_like(x)
    if x.numel():
        lib().sigmoid(x.data_ptr(), out.data_ptr(), x.numel())
    return out
