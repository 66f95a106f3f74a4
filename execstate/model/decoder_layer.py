"""One decoder block of the causal LM (``transformer.CausalLM.layers``).

Pre-norm: ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` (on the CPU kernels the first residual
add and the norm after it are one pass, ``cpu_kernels.add_rms_norm``: the same bits); ``mlp`` is a dense SwiGLU
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
