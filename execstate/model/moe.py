"""Sparse mixture-of-experts block with route capture and replay (R3).

Routing (per token, per MoE layer), as in the HF reference of each architecture:

1. ``logits = router(x)`` in the model dtype; ``probs = softmax(logits)`` in fp32.
2. ``weights, ids = topk(probs, k)``: sorted, ids ordered by descending probability.
3. Replay: if ``ctx.routes.forced(m)`` gives ``(mask, forced_ids)``, tokens whose mask is
   True take ``forced_ids`` and ``weights = probs.gather(forced_ids)``: the *live* router
   probabilities at the forced experts. Unforced tokens keep their top-k, bitwise.
4. If ``norm_topk_prob`` (always for Mixtral, whose softmax-over-top-k-logits is the same
   thing) the k weights are divided by their sum. The weights are then cast to the model
   dtype, except for Mixtral, which (like HF) keeps them in fp32 for the combine.
5. Capture: if ``ctx.routes`` is set, ``ctx.routes.record(m, ids)`` (stored as int16 by the
   capture), after forcing, so a forced token records its forced ids.

Forced ids are NOT validated here (range, duplicates within a row): the engine validates
them before building the ``RouteCapture``. An id outside ``[0, num_experts)`` raises
(``bincount``/indexing, or ``ValueError`` from the fused kernel); a duplicated id counts
that expert twice.

Experts are stored stacked: ``w_gate_up [E, 2I, H]`` (gate rows first) and
``w_down [E, H, I]``, the layout of transformers 5.x's in-memory expert tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from execstate.kernels import cpu as cpu_kernels
from execstate.kernels import formats
from execstate.kernels.weight_format import WeightFormat
from execstate.model.config import MIXTRAL, ModelConfig
from execstate.model.context import StepContext
from execstate.model.device.moe_dispatch import experts_grouped, fits_torch_grouped_mm
from execstate.model.layers import GatedMLP, Linear


class SparseMoE(nn.Module):
    """The MoE MLP of one decoder layer; ``moe_index`` is its index among MoE layers.

    ``forward(x [T, H], ctx) -> [T, H]``. Side effect: records this layer's routes in
    ``ctx.routes`` when set. Host syncs: none on torch ops where ``torch._grouped_mm`` fits the
    shapes or Triton runs (``model/device/moe_dispatch.py``); else one (the per-expert counts).
    Deterministic on every device: no atomics (each token's k expert outputs are written
    to their own slot, then summed over k in slot order).
    """

    use_kernels: bool = False  # fused CPU kernel for few-token steps (CausalLM.use_cpu_kernels)
    triton: bool = False  # the experts' grouped GEMM in Triton (model/device/moe_dispatch.py)
    batch_invariant: bool = False  # the router's softmax on the row kernel (model/gpu_path.py)
    weight_format: WeightFormat | None = None  # the experts' kernel format (model/weight_formats.py)

    def __init__(self, config: ModelConfig, moe_index: int) -> None:
        super().__init__()
        assert config.moe_intermediate_size is not None
        self.moe_index = moe_index
        self.num_experts, self.top_k = config.num_experts, config.top_k
        hidden, inter = config.hidden_size, config.moe_intermediate_size
        self.norm_topk_prob = config.norm_topk_prob
        self.weights_in_model_dtype = config.architecture != MIXTRAL
        self.router = Linear(hidden, self.num_experts, bias=False)
        self.w_gate_up = nn.Parameter(torch.empty(self.num_experts, 2 * inter, hidden), requires_grad=False)
        self.w_down = nn.Parameter(torch.empty(self.num_experts, hidden, inter), requires_grad=False)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: Linear | None = None
        if config.shared_expert_intermediate_size is not None:
            self.shared_expert = GatedMLP(hidden, config.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(hidden, 1, bias=False)

    def route(self, x: torch.Tensor, ctx: StepContext,
              logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids int64 ``[T, k]``, combine weights ``[T, k]``) for ``x`` ``[T, H]``; records routes.
        ``logits``: ``self.router(x)`` when the caller has it already (the whole-layer decode path)."""
        if logits is None:
            logits = self.router(x)
        if self.batch_invariant:
            from execstate.kernels.gpu.rows import softmax

            probs = softmax(logits)
        else:
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        routes = ctx.routes
        if routes is not None:
            forced = routes.forced(self.moe_index)
            if forced is not None:
                mask, forced_ids = forced
                mask = mask.to(device=ids.device)[:, None]
                ids = torch.where(mask, forced_ids.to(device=ids.device, dtype=ids.dtype), ids)
                weights = probs.gather(1, ids)
            routes.record(self.moe_index, ids)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.weights_in_model_dtype:
            weights = weights.to(logits.dtype)
        return ids, weights

    def experts(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Weighted sum of the chosen experts' SwiGLU outputs, ``[T, H]`` in ``x.dtype``.

        With ``use_kernels`` and a step ``cpu_kernels.use_moe`` accepts (fp32, few tokens), the
        fused C kernel computes the same sum (same slot order, fp32 rounding differs) in one
        call; otherwise the experts run as grouped GEMMs over expert-sorted tokens with no host
        read (``experts_grouped``), or, where neither ``torch._grouped_mm`` nor Triton fits, one
        torch GEMM pair each (``experts_torch``, one host read). With bf16 weights and fp32 ``x``
        (``model/bf16_weights.py``) the kernel is ``moe_bf16`` (any token count on AVX-512), and
        the torch path runs the experts in bf16 (torch's bf16 GEMM) and returns fp32. A
        ``weight_format`` (bf16 arithmetic, GGUF blocks) takes that format's fused kernel.
        """
        if self.weight_format is not None:  # bf16 arithmetic, GGUF blocks
            return formats.moe(x, ids.contiguous(), weights.float().contiguous(), self.w_gate_up, self.w_down,
                               self.weight_format)
        if self.use_kernels and cpu_kernels.use_moe(x, self.w_gate_up):
            return cpu_kernels.moe(x, ids.contiguous(), weights.float().contiguous(), self.w_gate_up, self.w_down)
        if self.w_gate_up.dtype is not x.dtype:  # bf16 weights, fp32 activations (model/bf16_weights.py)
            if self.use_kernels and cpu_kernels.use_moe_bf16(x, self.w_gate_up):
                return cpu_kernels.moe_bf16(x, ids.contiguous(), weights.float().contiguous(), self.w_gate_up,
                                            self.w_down)
            w_dtype = self.w_gate_up.dtype
            return experts_torch(x.to(w_dtype), ids, weights.to(w_dtype), self.w_gate_up, self.w_down).to(x.dtype)
        if self.triton or fits_torch_grouped_mm(x, self.w_gate_up, self.w_down):  # no host read
            return experts_grouped(x, ids, weights, self.w_gate_up, self.w_down, self.triton)
        return experts_torch(x, ids, weights, self.w_gate_up, self.w_down)

    def forward(self, x: torch.Tensor, ctx: StepContext, logits: torch.Tensor | None = None) -> torch.Tensor:
        ids, weights = self.route(x, ctx, logits)
        out = self.experts(x, ids, weights)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            g = self.shared_expert_gate(x)
            # the kernel's sigmoid: each gate the same bits whatever the step's other tokens
            gate = cpu_kernels.sigmoid(g) if self.use_kernels and cpu_kernels.use_rows(g) else torch.sigmoid(g)
            out = out + gate * self.shared_expert(x)
        return out


def experts_torch(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
                  w_down: torch.Tensor) -> torch.Tensor:
    """The torch path of ``SparseMoE.experts``: one GEMM pair per active expert.

    ``x [T, H]``, ``ids [T, k]``, ``weights [T, k]``, ``w_gate_up [E, 2I, H]`` (gate rows
    first), ``w_down [E, H, I]``; returns ``[T, H]`` in ``x.dtype``. Each token's k slot
    outputs are written to their own slot and summed over k in slot order (no atomics);
    one host sync (the per-expert token counts).
    """
    n, k = ids.shape
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=w_gate_up.shape[0]).tolist()  # the one host sync
    order = torch.argsort(flat, stable=True)  # slots grouped by expert
    xs = x[order // k]
    ys = torch.empty_like(xs)
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        end = start + count
        gate, up = F.linear(xs[start:end], w_gate_up[e]).chunk(2, dim=-1)
        ys[start:end] = F.linear(F.silu(gate) * up, w_down[e])
        start = end
    per_slot = torch.empty_like(ys).index_copy_(0, order, ys).view(n, k, -1)
    return (per_slot * weights[..., None]).to(x.dtype).sum(dim=1)
