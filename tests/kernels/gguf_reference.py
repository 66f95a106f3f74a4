"""Reference arithmetic for the GGUF kernel tests: blocks made by the ``gguf`` package's quantiser,
a correctly rounded float32 FMA in numpy, and the "GGUF dot order" (csrc/gemm_gguf.c) written out."""

from __future__ import annotations

import gguf
import numpy as np
import torch

from execstate.kernels.weight_format import WeightFormat

GGML_TYPES = {WeightFormat.Q8_0: gguf.GGMLQuantizationType.Q8_0, WeightFormat.Q4_0: gguf.GGMLQuantizationType.Q4_0,
              WeightFormat.Q4_1: gguf.GGMLQuantizationType.Q4_1}


def quantize(w: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """``w [..., K]`` fp32 quantised by the gguf package into uint8 blocks ``[..., K / 32 * bytes]``."""
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(w.numpy(), GGML_TYPES[fmt])))


def gguf_dequantize(blocks: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """The gguf package's own dequantisation (float32)."""
    return torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), GGML_TYPES[fmt]).astype(np.float32))


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``round32(a * b + c)`` with one rounding, for float32 arrays (broadcast): the product is exact
    in float64, the sum's float64 rounding error is recovered exactly (TwoSum), and a float32 tie
    created by that first rounding is broken towards the exact value."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = np.broadcast_to(c.astype(np.float64), p.shape)
    s = p + c64
    bv = s - p
    err = (p - (s - bv)) + (c64 - bv)  # s + err == p + c exactly
    out = s.astype(np.float32)
    tie = ((s.view(np.uint64) & np.uint64(0x1FFFFFFF)) == np.uint64(0x10000000)) & (err != 0)
    if tie.any():
        below = np.where(out.astype(np.float64) > s, np.nextafter(out, np.float32(-np.inf)), out)
        above = np.nextafter(below, np.float32(np.inf))
        out = np.where(tie, np.where(err > 0, above, below), out)
    return out


def gguf_dot_reference(x: torch.Tensor, wf: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ wf[N, K].T`` in the GGUF dot order (16 lanes, blocks in order, each lane's two
    values by FMA, then the lane tree) on the dequantised weights ``wf``; float32 ``[M, N]``."""
    xs, ws = x.numpy(), wf.numpy()
    m, k = xs.shape
    acc = np.zeros((m, ws.shape[0], 16), dtype=np.float32)
    for c in range(0, k, 16):
        acc = fma32(ws[None, :, c : c + 16], xs[:, None, c : c + 16], acc)
    s = acc[..., :8] + acc[..., 8:]
    s = s[..., :4] + s[..., 4:]
    s = s[..., :2] + s[..., 2:]
    return torch.from_numpy(s[..., 0] + s[..., 1])
