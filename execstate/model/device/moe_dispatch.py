"""MoE experts on the device with no host read: sort by expert, then a grouped GEMM.

``experts_grouped(x, ids, weights, w_gate_up, w_down, triton)`` computes what
``model/moe.experts_torch`` computes (each token's k expert outputs written to their own slot,
then weighted and summed over k in slot order by k - 1 elementwise adds: no atomics, no
reduction whose order could depend on the batch) without asking the host how many
tokens each expert got: the token-expert slots are sorted by expert (a stable argsort), each
expert's end in the sorted order comes from ``searchsorted`` on the device, and one grouped GEMM
per projection reads those ends on the device (Triton's ``kernels/gpu/grouped_mm.py`` where
Triton runs, else ``torch._grouped_mm``). So a step launches the same kernels whatever the
routing, and CUDA graphs can capture it.

``torch._grouped_mm`` needs rows whose strides are multiples of 16 bytes (hidden and expert
intermediate sizes multiples of 4 in fp32, 8 in bf16): ``fits_torch_grouped_mm`` says whether it
can run; where neither it nor Triton can, the caller keeps ``experts_torch`` (one host read).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fits_torch_grouped_mm(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` accepts this layer's shapes (16-byte row strides, one dtype)."""
    item = x.element_size()
    return (x.dtype == w_gate_up.dtype == w_down.dtype and x.dtype in (torch.float32, torch.bfloat16)
            and all(n * item % 16 == 0 for n in (w_gate_up.shape[2], w_gate_up.shape[1], w_down.shape[2])))


def _mm_torch(a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, w.transpose(1, 2), offs=ends)


def _mm_triton(a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    from execstate.kernels.gpu.grouped_mm import grouped_mm

    return grouped_mm(a, w, ends)


def experts_grouped(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
                    w_down: torch.Tensor, triton: bool) -> torch.Tensor:
    """Weighted sum of the chosen experts' SwiGLU outputs, ``[T, H]`` in ``x.dtype``.

    ``x [T, H]``, ``ids [T, k]`` int64 in ``[0, E)``, ``weights [T, k]``, ``w_gate_up [E, 2I, H]``
    (gate rows first), ``w_down [E, H, I]``. No host read; deterministic (no atomics)."""
    n, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    experts = torch.arange(w_gate_up.shape[0], device=flat.device, dtype=flat.dtype)
    ends = torch.searchsorted(flat.index_select(0, order), experts, right=True).to(torch.int32)
    mm = _mm_triton if triton else _mm_torch
    xs = x.index_select(0, order // k)
    gate, up = mm(xs, w_gate_up, ends).chunk(2, dim=-1)
    ys = mm(F.silu(gate) * up, w_down, ends)
    per_slot = torch.empty_like(ys).index_copy_(0, order, ys).view(n, k, -1)
    weighted = (per_slot * weights[..., None]).to(x.dtype)
    out = weighted[:, 0]
    for j in range(1, k):  # slot order, one elementwise add each: the same bits in any batch
        out = out + weighted[:, j]
    return out
