"""Linear and the fused MoE expert block on GGUF quantised weights (C: ``csrc/gemm_gguf.c``).

A matrix ``[N, K]`` in ``Q8_0``, ``Q4_0`` or ``Q4_1`` is a uint8 tensor ``[N, K / 32 * block bytes]``:
each row its blocks exactly as a GGUF file stores them (``weight_format.py``). The kernels
dequantise each block in registers (the values are llama.cpp's and the ``gguf`` package's,
bit for bit) and multiply fp32 activations with fp32 sums in one fixed order for every row count
(the "GGUF dot order", ``gemm_gguf.c``): deterministic and batch-invariant. Where the CPU lacks
AVX-512 the 8-lane kernels compute the same order: the same bits, the same numerics id.
``dequantize`` gives the same values as fp32 (tests), ``dequantize_rows`` those of a matrix's rows
(the embedding lookup).
"""

from __future__ import annotations

import numpy as np
import torch

from execstate.kernels.ext import F32, lib, require, sync_threads
from execstate.kernels.gemm import PACKED, moe_sizes
from execstate.kernels.weight_format import GGUF_BLOCK, GGUF_BLOCK_BYTES, WeightFormat

# The name of each format in a provenance kernel set ([a-z0-9.-] only).
KERNEL_SET_NAMES = {WeightFormat.Q8_0: "q80", WeightFormat.Q4_0: "q40", WeightFormat.Q4_1: "q41"}
U8 = torch.uint8
_AVX2 = int(not PACKED)  # the 8-lane kernels where AVX-512 is missing (same bits)


def _check_matrix(name: str, w: torch.Tensor, rows: int | None, cols: int, fmt: WeightFormat) -> None:
    if not isinstance(fmt, WeightFormat) or not fmt.quantized:
        raise ValueError(f"{name}: {fmt!r} is not a GGUF block format")
    if cols % GGUF_BLOCK:
        raise ValueError(f"{name}: {cols} columns is not a multiple of {GGUF_BLOCK}")
    width = cols // GGUF_BLOCK * GGUF_BLOCK_BYTES[fmt]
    if w.shape[-1] != width or (rows is not None and w.shape[-2] != rows):
        raise ValueError(f"{name}: {fmt.name} blocks for {cols} columns are {width} bytes a row, "
                         f"got {tuple(w.shape)}")


def linear_gguf(x: torch.Tensor, weight: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """``x [M, K] @ dequant(weight).T`` -> new fp32 ``[M, N]``; ``weight`` uint8 ``[N, K / 32 * bytes]``."""
    require(x, "x", 2)
    require(weight, "weight", 2, U8)
    m, k = x.shape
    _check_matrix("linear_gguf", weight, None, k, fmt)
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=F32)
    if m and n:
        sync_threads()
        lib().linear_gguf(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, k, n, int(fmt), _AVX2)
    return y


def moe_gguf(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
             w_down: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """``gemm.moe``'s contract with both expert tensors in GGUF blocks: ``w_gate_up`` uint8
    ``[E, 2I, H / 32 * bytes]``, ``w_down`` uint8 ``[E, H, I / 32 * bytes]``."""
    require(x, "x", 2)
    require(w_gate_up, "w_gate_up", 3, U8)
    require(w_down, "w_down", 3, U8)
    e, two_i = w_gate_up.shape[:2]
    h, i = x.shape[1], two_i // 2
    _check_matrix("moe_gguf: w_gate_up", w_gate_up, two_i, h, fmt)
    _check_matrix("moe_gguf: w_down", w_down, h, i, fmt)
    if w_down.shape[0] != e:
        raise ValueError(f"moe_gguf: {w_down.shape[0]} down experts for {e} gate/up experts")
    # the shared checks on x, ids and weights, with stand-in expert shapes of the right sizes
    t, _, _, _ = moe_sizes("moe_gguf", x, ids, weights, torch.empty((e, two_i, h)), torch.empty((e, h, i)))
    out = torch.empty((t, h), dtype=F32)
    if t:
        sync_threads()
        lib().moe_gguf(x.data_ptr(), ids.data_ptr(), weights.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(),
                       out.data_ptr(), t, ids.shape[1], e, h, i, int(fmt), _AVX2)
    return out


def _values(b: np.ndarray, fmt: WeightFormat) -> np.ndarray:
    """The fp32 values of GGUF blocks ``b [..., n, bytes]`` (uint8) -> ``[..., n * 32]``: the
    kernels' values exactly (``d * q``, ``d * (q - 8)``, ``d * q + m``; the products are exact)."""
    d = b[..., 0:2].view(np.float16).astype(np.float32)
    if fmt is WeightFormat.Q8_0:
        v = d * b[..., 2:].view(np.int8).astype(np.float32)
    else:
        qs = b[..., (4 if fmt is WeightFormat.Q4_1 else 2):]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float32)
        v = d * (q - 8) if fmt is WeightFormat.Q4_0 else d * q + b[..., 2:4].view(np.float16).astype(np.float32)
    return v.reshape(*b.shape[:-2], -1)


def dequantize(blocks: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """The fp32 values of the CPU GGUF rows ``blocks [..., K / 32 * bytes]`` -> ``[..., K]`` (the
    kernels' values exactly: ``d * q``, ``d * (q - 8)``, ``d * q + m`` with the products exact)."""
    if not isinstance(fmt, WeightFormat) or not fmt.quantized or blocks.dtype != U8 or not blocks.is_cpu:
        raise ValueError(f"dequantize: uint8 CPU GGUF blocks and a block format, got {blocks.dtype} "
                         f"on {blocks.device} {fmt!r}")
    bb = GGUF_BLOCK_BYTES[fmt]
    if blocks.shape[-1] % bb:
        raise ValueError(f"dequantize: rows of {blocks.shape[-1]} bytes are not whole {fmt.name} blocks")
    b = np.ascontiguousarray(blocks.numpy()).reshape(*blocks.shape[:-1], -1, bb)
    return torch.from_numpy(_values(b, fmt))


def dequantize_rows(weight: torch.Tensor, ids: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """Rows ``ids`` ``[T]`` of the CPU GGUF matrix ``weight [N, K / 32 * bytes]`` as a new fp32
    ``[T, K]``: ``dequantize(weight[ids], fmt)`` without the torch indexing, whose dispatch costs
    ~5 us an op after a forward pass has left the caches cold (the embedding of every decode
    step)."""
    if not isinstance(fmt, WeightFormat) or not fmt.quantized or weight.dtype != U8 or weight.dim() != 2:
        raise ValueError(f"dequantize_rows: a uint8 [N, bytes] GGUF matrix and a block format, got "
                         f"{weight.dtype} {tuple(weight.shape)} {fmt!r}")
    bb = GGUF_BLOCK_BYTES[fmt]
    if weight.shape[1] % bb or not weight.is_cpu or not weight.is_contiguous():
        raise ValueError(f"dequantize_rows: rows of {weight.shape[1]} bytes are not whole {fmt.name} blocks "
                         "of a contiguous CPU matrix")
    return torch.from_numpy(_values(weight.numpy()[ids.numpy()].reshape(ids.shape[0], -1, bb), fmt))


def gguf_kernel_set(formats: set[WeightFormat]) -> str:
    """The provenance kernel set of a model whose matrices use the block ``formats`` (fp32 kernels
    for the rest): one id per combination, e.g. ``cpu-gguf-q41-q80-v2`` (v2: the routing of KERNEL_SET v2)."""
    names = sorted(KERNEL_SET_NAMES[f] for f in formats if f.quantized)
    if not names:
        raise ValueError("gguf_kernel_set: no GGUF block format")
    return f"cpu-gguf-{'-'.join(names)}-v2"
