"""bf16 weights on an fp32 model: the numerics of ``dtype="bfloat16"`` with execstate's CPU kernels.

What is bf16: every matmul weight (attention q/k/v and output projections, dense MLP, router,
the MoE experts ``w_gate_up``/``w_down``, shared expert and its gate, the LM head) and the token
embedding table (the LM head when tied). What stays fp32: norms' weights, biases, RoPE tables,
every activation, the KV cache and every accumulation. Weights are rounded to bf16 once
(round-to-nearest-even, as ``tensor.to(torch.bfloat16)``; exact for a bf16 checkpoint).

Why: decode streams every weight once per step, so its speed is bound by weight bytes; bf16
halves them. Activations stay fp32 so decode rounds only the weights (the C kernels widen each
bf16 exactly and accumulate in fp32: ``kernels/gemm_bf16.py``).

Large-row calls (prefill, more than ``MAX_LINEAR_ROWS_BF16`` rows) use torch's bf16 GEMM
(``linear_mixed``): the input rows are rounded to bf16, products accumulate in fp32, the output is
rounded to bf16 and returned as fp32. Measured on this 2-core AVX512-BF16 Zen CPU
(1536x512 weight, 256 rows, one thread): 1.5 ms, against 7.3 ms for widening the weight to fp32
and running torch's fp32 GEMM; prefill is compute-bound, so bf16 arithmetic is what pays there.
The engine records the whole mode in its provenance numerics (``KERNEL_SET_BF16``).
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
