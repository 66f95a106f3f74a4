"""bf16 weights on an fp32 model: the numerics of ``dtype="bfloat16"`` with execstate's CPU kernels.

What is bf16: every matmul weight (attention q/k/v and output projections, dense MLP, router,
the MoE experts ``w_gate_up``/``w_down``, shared expert and its gate, the LM head) and the token
embedding table (the LM head when tied). What stays fp32: norms' weights, biases, RoPE tables,
every activation, the KV cache and every accumulation. Weights are rounded to bf16 once
(round-to-nearest-even, as ``tensor.to(torch.bfloat16)``; exact for a bf16 checkpoint).

Why: decode streams every weight once per step, so its speed is bound by weight bytes; bf16
halves them. Activations stay fp32 so decode rounds only the weights (the C kernels widen each
bf16 exactly and accumulate in fp32: ``kernels/gemm_bf16.py``).

Every row count takes these kernels where the CPU has AVX-512 (prefill on the packed kernels,
which widen each block of weight rows once per call): so a row's result is the same, bit for
bit, whichever step computes it (decode, prefill, a mixed batch): batch invariance, as in fp32.
Measured (standard model, 8 x 256-token prefill, 2 Zen 5 cores): 6.1k tok/s, against 6.9k with
torch's bf16 GEMM (activations rounded to bf16, so not batch-invariant) and 5.8k in fp32.
Without AVX-512 (or without the kernels) calls above ``MAX_LINEAR_ROWS_BF16`` rows use torch's
bf16 GEMM (``linear_mixed``): input rows rounded to bf16, fp32 sums, output rounded to bf16,
returned as fp32. The engine records the mode in its provenance numerics (``KERNEL_SET_BF16``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BF16 = torch.bfloat16


def linear_mixed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` for fp32 ``x`` and a bf16 ``weight`` via torch's bf16 GEMM; fp32 out."""
    y = F.linear(x.to(BF16), weight).to(x.dtype)
    return y if bias is None else y.add_(bias)


def store_weights_bf16(model: nn.Module) -> None:
    """Replace every parameter of 2 or more dims (the matrices a matmul or the embedding reads;
    norms' weights and biases are 1-D) with a contiguous bf16 copy, in place on ``model``; tied
    parameters stay tied. The model's activations are unchanged (fp32)."""
    done: dict[int, nn.Parameter] = {}
    modules = dict(model.named_modules())
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.dim() < 2:
            continue
        new = done.get(id(p))
        if new is None:
            new = nn.Parameter(p.detach().to(BF16).contiguous(), requires_grad=False)
            done[id(p)] = new
        module_name, _, attr = name.rpartition(".")
        setattr(modules[module_name], attr, new)
