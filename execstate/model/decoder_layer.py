"""One decoder block of the causal LM (``transformer.CausalLM.layers``).

Pre-norm: ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` (on the CPU kernels the first residual
add and the norm after it are one pass, ``cpu_kernels.add_rms_norm``, or for a prefill's rows the
o-proj's epilogue, ``Attention.project_add_norm``: the same bits; ``forward_parts``
leaves the second to the next block's norm, or the model's final one, in the same way); ``mlp`` is a dense SwiGLU
(``GatedMLP``) or a ``SparseMoE`` for the layers ``config.moe_layers`` lists. Its own module so
that the whole-layer decode path (``decode_path.py``), which reads a layer's weights, and the
model (``transformer.py``), which runs that path, import it in one direction.
"""

from __future__ import annotations

import torch
from torch import nn

from execstate.kernels import cpu as cpu_kernels
from execstate.model.config import ModelConfig
from execstate.model.context import StepContext
from execstate.model.layers import Attention, GatedMLP, RMSNorm
from execstate.model.moe import SparseMoE


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``; ``mlp`` is dense or MoE."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config, layer_idx)
        self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: GatedMLP | SparseMoE
        if layer_idx in config.moe_layers:
            self.mlp = SparseMoE(config, config.moe_layers.index(layer_idx))
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ctx: StepContext) -> torch.Tensor:
        a = self.attn(self.input_norm(x), cos, sin, ctx)
        norm = self.post_attn_norm
        if norm.use_kernels and not norm.batch_invariant and cpu_kernels.use_rows(x) and cpu_kernels.use_rows(a):
            x, h = cpu_kernels.add_rms_norm(x, a, norm.weight, norm.eps)  # x + a, then the norm, one pass
            m = self.mlp(h, ctx) if isinstance(self.mlp, SparseMoE) else self.mlp(h)
            # the kernels' MLP output is a new tensor of this call: the residual add lands in it
            return m.add_(x) if cpu_kernels.use_rows(m) else x + m
        x = x + a
        h = norm(x)
        return x + (self.mlp(h, ctx) if isinstance(self.mlp, SparseMoE) else self.mlp(h))

    def forward_parts(self, x: torch.Tensor, pending: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                      ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward(x + pending)`` (``x`` alone when ``pending`` is None) as ``(s, m)``, the block's
        output being ``s + m`` (``m`` None: ``s`` alone). On the CPU kernels (``fuses_residuals``) the
        MLP's residual add is left to the next consumer, which does it with its norm in one pass
        (``cpu_kernels.add_rms_norm``: the next block's ``forward_parts`` or the model's final
        norm), the same bits as ``forward``'s ``m + x`` followed by the norm (an IEEE add of two
        does not depend on the order). ``pending``'s storage is taken for the sum."""
        norm = self.input_norm
        if pending is None:
            h = norm(x)
        elif self.fuses_residuals(x) and cpu_kernels.use_rows(pending):
            x, h = cpu_kernels.add_rms_norm(x, pending, norm.weight, norm.eps)
        else:
            x = x + pending
            h = norm(x)
        post = self.post_attn_norm
        if self.fuses_residuals(x) and self.attn.projects_with_norm(x.shape[0]):  # the add and norm in the o-proj
            x, h = self.attn.project_add_norm(self.attn.attend(h, cos, sin, ctx), x, post)
            m = self.mlp(h, ctx) if isinstance(self.mlp, SparseMoE) else self.mlp(h)
            return (x, m) if cpu_kernels.use_rows(m) else (x + m, None)
        a = self.attn(h, cos, sin, ctx)
        if not (self.fuses_residuals(x) and cpu_kernels.use_rows(a)):
            x = x + a
            h = post(x)
            return x + (self.mlp(h, ctx) if isinstance(self.mlp, SparseMoE) else self.mlp(h)), None
        x, h = cpu_kernels.add_rms_norm(x, a, post.weight, post.eps)
        m = self.mlp(h, ctx) if isinstance(self.mlp, SparseMoE) else self.mlp(h)
        return (x, m) if cpu_kernels.use_rows(m) else (x + m, None)

    def fuses_residuals(self, x: torch.Tensor) -> bool:
        """Whether this block's norms run the kernels' fused residual add (``add_rms_norm``) on ``x``."""
        norms = (self.input_norm, self.post_attn_norm)
        return all(n.use_kernels and not n.batch_invariant for n in norms) and cpu_kernels.use_rows(x)
