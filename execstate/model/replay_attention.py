"""Cache-free causal attention over one sequence on the CPU kernels: the scorer's backend.

``KernelCausalAttention`` is the ``AttentionBackend`` of ``engine/scorer.py`` when the model
runs on execstate's CPU kernels. Like ``DenseCausalAttention`` it takes ONE sequence of T
tokens at positions ``0..T-1`` and keeps nothing between calls; unlike it, every query row
runs the paged attention kernel (``PagedDecode.for_spans``) exactly as the engine runs it for
a prefill or a decode: the sequence's own K/V are the "cache" (one block of T slots), and
query ``i`` attends to positions ``0..i`` with the kernel's per-row order of operations. So
each row's attention output equals, bit for bit, the one the engine computed for that token
when it generated the sequence (whatever its batch, its chunking, a prefix hit or a PD load:
the kernel's result depends on the row's own query and context only). This is what makes
scoring a rollout reproduce its logprobs exactly (``LLM.score`` with the routes).
"""

from __future__ import annotations

import torch

from execstate.kernels.paged_decode import PagedDecode


class KernelCausalAttention:
    """``AttentionBackend`` for one sequence of ``num_tokens`` tokens from position 0 (fp32, CPU
    kernels). The plan is built once; every layer's call checks its tensors (``PagedDecode.run``).
    ``kv_dtype``: the engine's KV cache dtype; with bf16 the sequence's K/V are rounded to bf16
    as the engine's pool stores them, so the rows equal the engine's in that mode too."""

    def __init__(self, num_tokens: int, kv_dtype: torch.dtype = torch.float32) -> None:
        if num_tokens < 1:
            raise ValueError(f"KernelCausalAttention needs at least one token, got {num_tokens}")
        if kv_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"KernelCausalAttention: K/V in float32 or bfloat16, got {kv_dtype}")
        self.num_tokens, self.kv_dtype = num_tokens, kv_dtype
        self.plan = PagedDecode.for_spans([0], [num_tokens], [[0]], [num_tokens], num_tokens, num_tokens)

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        self.plan.run(q, k.to(self.kv_dtype).contiguous(), v.to(self.kv_dtype).contiguous(), out, q.shape[-1] ** -0.5)
        return out
