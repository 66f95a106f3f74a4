"""Attention straight on the paged KV cache, in Triton: every query row of a step, decode or
prefill, reads its context through its sequence's block table. No gathered or padded copy.

Layout (the pool's, ``state/kv_pool.py``): one layer's K (and V) is ``[slots, n_kv, d]`` with
``slots = num_blocks * block_size``; block ``b`` owns slots ``[b * block_size, (b + 1) *
block_size)``. A step describes its query rows by two int64 vectors over its ``T`` tokens,
``token_seq[T]`` (the row of ``block_table`` of the token's sequence) and ``positions[T]`` (its
position: it attends to positions ``0..pos`` of its sequence), plus ``block_table[B, max_blocks]``.
The K/V of the step's own tokens must already be in the pool (the caller writes them first), so
a prefill after a cached prefix, a chunk of a chunked prefill and a decode are the same case.

One program per (token, KV head) computes the query heads of that KV head's group (GQA without
repeating K/V) with an online softmax over key tiles of ``BLOCK_N`` positions in increasing
order. A row's result depends on its query and its context only: the same bits in any batch, in
a prefill or a decode (what the deterministic mode needs). fp32 inputs use exact fp32 dot
products (``input_precision="ieee"``), bf16 inputs tensor-core dots with fp32 accumulation.
Under Triton's interpreter bf16 operands are widened to fp32 before each dot (Triton 3.6's
interpreter computes bf16 ``tl.dot`` on the raw bits): the bf16 dots themselves run on a GPU only.

``paged_attention_reference`` is the float64 torch oracle the tests compare with.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from execstate.kernels.family import interpreted

BLOCK_N = 32  # key positions per tile


@triton.jit
def _paged_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, seq_ptr, pos_ptr, table_ptr, table_stride, scale,
                            stride_qt, stride_qh, stride_ks, stride_kh, stride_ot, stride_oh,
                            GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                            D_PAD: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
                            UPCAST: tl.constexpr):
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(seq_ptr + t)
    ctx = tl.load(pos_ptr + t) + 1
    rh = tl.arange(0, GROUP_PAD)
    rd = tl.arange(0, D_PAD)
    head_ok = rh < GROUP
    d_ok = rd < HEAD_DIM
    heads = kvh * GROUP + rh
    q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + rd[None, :],
                mask=head_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    s_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    for start in range(0, ctx, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        key_ok = rn < ctx
        blk = tl.load(table_ptr + seq * table_stride + rn // PAGE, mask=key_ok, other=0)
        slot = blk * PAGE + rn % PAGE
        kt = tl.load(k_ptr + slot[None, :] * stride_ks + kvh * stride_kh + rd[:, None],
                     mask=key_ok[None, :] & d_ok[:, None], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        if IEEE:  # noqa: SIM108 - Triton branches on constexprs as statements
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = tl.where(key_ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        s_sum = s_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + slot[:, None] * stride_ks + kvh * stride_kh + rd[None, :],
                    mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        if IEEE:  # noqa: SIM108
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    out = acc / s_sum[:, None]
    tl.store(out_ptr + t * stride_ot + heads[:, None] * stride_oh + rd[None, :], out.to(out_ptr.dtype.element_ty),
             mask=head_ok[:, None] & d_ok[None, :])


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                    token_seq: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor, block_size: int,
                    scale: float) -> torch.Tensor:
    """``out[t] = softmax(q[t] K^T * scale) V`` over positions ``0..positions[t]`` of sequence
    ``token_seq[t]`` (module docstring). ``q``/``out`` ``[T, n_heads, d]``, caches ``[slots, n_kv, d]``
    (last dim contiguous), ``token_seq``/``positions`` int64 ``[T]``, ``block_table`` int64 ``[B, W]``.
    ``ValueError`` for mismatched shapes or dtypes. Returns ``out``."""
    t, n_heads, d = q.shape
    n_kv = k_cache.shape[1]
    if k_cache.shape != v_cache.shape or k_cache.shape[2] != d or n_heads % n_kv:
        raise ValueError(f"paged_attention: q {tuple(q.shape)} and caches {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)} do not fit")
    if out.shape != q.shape or q.dtype != k_cache.dtype or out.dtype != q.dtype:
        raise ValueError("paged_attention: out must have q's shape and every tensor the cache's dtype")
    if token_seq.shape != (t,) or positions.shape != (t,) or block_table.dim() != 2:
        raise ValueError("paged_attention: token_seq and positions must be [T], block_table [B, W]")
    if q.stride(2) != 1 or k_cache.stride(2) != 1 or v_cache.stride() != k_cache.stride() or out.stride(2) != 1:
        raise ValueError("paged_attention: the head dimension must be contiguous, K and V strided alike")
    if t == 0:
        return out
    group = n_heads // n_kv
    _paged_attention_kernel[(t, n_kv)](
        q, k_cache, v_cache, out, token_seq, positions, block_table, block_table.stride(0), scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d,
        D_PAD=max(16, triton.next_power_of_2(d)), PAGE=block_size, BLOCK_N=BLOCK_N,
        IEEE=q.dtype == torch.float32, UPCAST=q.dtype != torch.float32 and interpreted())
    return out


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              token_seq: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                              block_size: int, scale: float) -> torch.Tensor:
    """The oracle: each token's context gathered from its block table, attention in float64.
    Returns ``[T, n_heads, d]`` float64."""
    n_heads, n_kv = q.shape[1], k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        ctx = int(positions[t]) + 1
        blocks = block_table[int(token_seq[t])][: -(-ctx // block_size)].long()
        slots = (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:ctx]
        k = k_cache[slots].double().repeat_interleave(n_heads // n_kv, dim=1)  # [ctx, H, d]
        v = v_cache[slots].double().repeat_interleave(n_heads // n_kv, dim=1)
        s = torch.einsum("hd,chd->hc", q[t].double(), k) * scale
        out[t] = torch.einsum("hc,chd->hd", torch.softmax(s, dim=-1), v)
    return out
