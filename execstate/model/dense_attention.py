"""Cache-free causal attention over one sequence: the oracle ``AttentionBackend``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DenseCausalAttention:
    """``AttentionBackend`` for ONE sequence of T tokens at positions ``0..T-1``, no cache.

    Token ``i`` attends to tokens ``0..i`` of the same call (plain causal mask), so the
    step must contain the whole sequence from position 0. Stores nothing; scale is
    ``head_dim ** -0.5``; GQA via SDPA's ``enable_gqa``. Works on any device/dtype.
    """

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            is_causal=True, scale=q.shape[-1] ** -0.5, enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(0, 1)
