"""Grouped GEMM in Triton: ``out[r] = x[r] @ w[g].T`` for the rows ``r`` of group ``g``.

Rows come sorted by group; ``ends[g]`` (int32, on the device) is the end of group ``g``'s rows
(an inclusive cumulative count), so the launch needs no host read of the group sizes: the grid
covers every group with ``cdiv(rows, BLOCK_M)`` row tiles, and a tile past its group's end
returns at once. This is the MoE experts' GEMM (``model/device/moe_dispatch.py``: rows are
token-expert slots sorted by expert, ``w`` is ``[E, N, K]``), and with one group
(``ends = [rows]``) the deterministic mode's dense linear.

Fixed tile shapes, no split-K, no atomics: each output element is one dot product accumulated
over ``K`` in ``BLOCK_K`` steps in increasing order, whatever the number of rows, the other
groups or the tile the row lands in. So a row's result does not depend on its batch (batch
invariance). fp32 operands use exact fp32 dots (``input_precision="ieee"``); bf16 operands
tensor-core dots with fp32 accumulation (widened to fp32 under Triton's interpreter, whose bf16
``tl.dot`` is wrong in Triton 3.6).

Under Triton's interpreter each tile's dot is written out as products summed over ``BLOCK_K`` in
increasing order (``EXPLICIT``): the interpreter's ``tl.dot`` is numpy's ``matmul``, i.e. the
host BLAS, whose result for a row can depend on the row's place in the tile (OpenBLAS's AVX-512
sgemm on an AMD EPYC gives other last bits for 20 of 32 rows of a ``[32, 32] @ [32, 64]``), so
the tests of batch invariance on the CPU would test the BLAS and not this kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from execstate.kernels.family import interpreted

BLOCK_M, BLOCK_N, BLOCK_K = 32, 64, 32


@triton.jit
def _grouped_mm_kernel(x_ptr, w_ptr, out_ptr, ends_ptr, n_cols, k_dim, tiles_per_group,
                       stride_xm, stride_wg, stride_wn, stride_om,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       IEEE: tl.constexpr, UPCAST: tl.constexpr, EXPLICIT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = pid_m // tiles_per_group
    tile = pid_m % tiles_per_group
    end = tl.load(ends_ptr + g)
    start = tl.load(ends_ptr + g - 1, mask=g > 0, other=0)
    rm = start + tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rm < end
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = rn < n_cols
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < k_dim
        a = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + g * stride_wg + rn[None, :] * stride_wn + kk[:, None], mask=col_ok[None, :] & k_ok[:, None],
                    other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if EXPLICIT:  # the interpreter: one fixed order per output element (the module's docstring)
            acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)
        elif IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def grouped_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``[rows, N]``: row ``r`` of group ``g`` (``ends[g-1] <= r < ends[g]``) times ``w[g].T``.

    ``x`` ``[rows, K]``, ``w`` ``[G, N, K]`` (last dim contiguous), ``ends`` int32 ``[G]``
    non-decreasing with ``ends[-1] <= rows`` (rows past it are left unwritten). ``ValueError`` for
    mismatched shapes or dtypes."""
    rows, k = x.shape
    if w.dim() != 3 or w.shape[2] != k or ends.shape != (w.shape[0],) or ends.dtype != torch.int32:
        raise ValueError(f"grouped_mm: x {tuple(x.shape)}, w {tuple(w.shape)}, ends {tuple(ends.shape)} "
                         f"{ends.dtype} do not fit (w [G, N, K], ends int32 [G])")
    if x.dtype != w.dtype or x.stride(1) != 1 or w.stride(2) != 1:
        raise ValueError("grouped_mm: x and w must share a dtype and have a contiguous last dimension")
    n = w.shape[1]
    if out is None:
        out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    tiles = triton.cdiv(rows, BLOCK_M)
    grid = (w.shape[0] * tiles, triton.cdiv(n, BLOCK_N))
    _grouped_mm_kernel[grid](x, w, out, ends, n, k, tiles, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
                             BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, IEEE=x.dtype == torch.float32,
                             UPCAST=x.dtype != torch.float32 and interpreted(), EXPLICIT=interpreted())
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The batch-invariant ``F.linear``: one group over every row of ``x`` ``[..., K]``."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    ends = torch.full((1,), x2.shape[0], dtype=torch.int32, device=x.device)
    y = grouped_mm(x2, weight.unsqueeze(0), ends)
    if bias is not None:
        y = y + bias
    return y.view(*lead, weight.shape[0])
