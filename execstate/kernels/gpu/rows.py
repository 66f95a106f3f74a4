"""Row-wise RMSNorm, softmax and log-softmax in Triton, one program per row.

Each row is reduced by one program in ``BLOCK`` chunks in increasing order, whatever the number
of rows: the result of a row does not depend on the others (batch invariance), unlike a
library reduction that splits a row across programs when there are few rows. Used by the
deterministic mode (``model/gpu_path.py``). RMSNorm follows the HF reference:
``weight * (x / rms(x))`` in fp32, cast to the input dtype before the weight multiplies it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n, eps, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for c in range(0, n, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n, other=0.0).to(tl.float32)
        acc += x * x
    inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n + eps)
    for c in range(0, n, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        ok = cols < n
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0)
        y = (x * inv).to(out_ptr.dtype.element_ty) * w
        tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n, stride_x, stride_o, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for c in range(0, n, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # lanes still at -inf keep a zero sum (no inf - inf)
        s = tl.where(m_new == float("-inf"), 0.0, s * tl.exp(m - m_new) + tl.exp(x - m_new))
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    for c in range(0, n, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        ok = cols < n
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
        if LOG:  # noqa: SIM108 - Triton branches on constexprs as statements
            y = x - row_max - tl.log(total)
        else:
            y = tl.exp(x - row_max) / total
        tl.store(out_ptr + row * stride_o + cols, y, mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` (any leading shape), in ``x.dtype``."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if weight.shape != (x2.shape[1],):
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} for rows of {x2.shape[1]}")
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.shape[1], eps, x2.stride(0), out.stride(0),
                                         BLOCK=min(BLOCK, triton.next_power_of_2(x2.shape[1])))
    return out.view(x.shape)


def softmax(x: torch.Tensor, log: bool = False) -> torch.Tensor:
    """(log-)softmax over the last dim of 2-D ``x``, fp32 out (``torch.softmax(x, -1, dtype=float32)``)."""
    if x.dim() != 2:
        raise ValueError(f"softmax: x must be 2-D, got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    if x.shape[0]:
        _softmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), out.stride(0), LOG=log,
                                       BLOCK=min(BLOCK, triton.next_power_of_2(x.shape[1])))
    return out
