"""Decoder-only causal LM over a flat token batch.

``CausalLM.forward(input_ids [T], ctx) -> hidden [T, H]`` (after the final norm) and
``compute_logits(hidden [n, H]) -> float32 [n, vocab]``: the engine picks which rows need
logits (usually the last token of each sequence) between the two calls. Positions come
from ``ctx.positions``; attention goes through ``ctx.attention``; MoE layers record (and
replay) routes through ``ctx.routes``. Parameter names are ours (see ``loader.py`` for the
mapping from HF checkpoint names).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from execstate.kernels import cpu as cpu_kernels
from execstate.kernels import formats
from execstate.kernels.weight_format import WeightFormat
from execstate.model.bf16_weights import linear_mixed, store_weights_bf16
from execstate.model.config import ModelConfig
from execstate.model.context import StepContext
from execstate.model.decode_path import DecodeWeights, decode_layers
from execstate.model.decoder_layer import DecoderLayer
from execstate.model.layers import Attention, GatedMLP, Linear, RMSNorm
from execstate.model.moe import SparseMoE
from execstate.model.rotary import RotaryEmbedding

# Modules whose forward has a ``use_kernels`` switch (CausalLM.use_cpu_kernels).
_KERNEL_MODULES = (Linear, RMSNorm, Attention, GatedMLP, SparseMoE)


class CausalLM(nn.Module):
    """A causal LM built from a ``ModelConfig``; weights are uninitialised until loaded.

    Build on the ``meta`` device and load with ``loader.load_model`` (or
    ``loader.load_hf_weights``) to avoid initialising tensors that are then overwritten. All
    parameters have ``requires_grad=False``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config)
        self.kernels = False
        self.head_format: WeightFormat | None = None  # the LM head's kernel format (model/weight_formats.py)
        self._decode_weights: DecodeWeights | None = None  # decode_path's checked weights, built on first use
        self.batch_invariant = False  # the LM head on the deterministic GPU mode's matmul (model/device/)
        self.requires_grad_(False)

    def use_cpu_kernels(self, enabled: bool) -> None:
        """Route few-row fp32 linears, the fused MoE block, the LM head, RMSNorm, the q/k/v
        split + QK-norm + RoPE and the SwiGLU gate through ``execstate.kernels.cpu``
        (``enabled``), or keep every op in torch. Raises
        ``RuntimeError`` when enabling on a machine where the kernels are unavailable."""
        if enabled and not cpu_kernels.available():
            raise RuntimeError(f"execstate CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")
        self.kernels = enabled
        self._decode_weights = None
        for module in self.modules():
            if isinstance(module, _KERNEL_MODULES):
                module.use_kernels = enabled

    def store_weights_bf16(self) -> None:
        """Keep every matrix (matmul weights, embeddings) in bf16 and compute in fp32
        (``model/bf16_weights.py``). Call on an fp32 model, before ``use_cpu_kernels``."""
        store_weights_bf16(self)
        self.drop_decode_weights()  # parameters replaced: the decode path rebuilds its pointers

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Hidden states ``[T, H]`` (final norm applied) for the flat batch ``input_ids`` ``[T]``.

        Must be called inside ``ctx`` (``with ctx:``). ``ctx.positions`` is ``[T]``; when
        ``ctx.routes`` is set its shape must be ``(T, num_moe_layers, top_k)``.
        """
        ctx.check_active()
        n = input_ids.shape[0]
        if input_ids.dim() != 1 or ctx.positions.shape != (n,):
            raise ValueError(f"input_ids must be [T] and positions [T]; got {tuple(input_ids.shape)} "
                             f"and {tuple(ctx.positions.shape)}")
        routes = ctx.routes
        if routes is not None:
            want = (n, self.config.num_moe_layers, self.config.top_k)
            got = (routes.num_tokens, routes.num_moe_layers, routes.top_k)
            if got != want:
                raise ValueError(f"RouteCapture shape {got} != (tokens, moe layers, top_k) {want}")
        timers = ctx.timers
        t0 = timers.now() if timers is not None else 0.0
        x = self.embed_tokens(input_ids)
        if x.dtype is not self.norm.weight.dtype:  # bf16 weights: activations in the norms' dtype (fp32)
            x = x.to(self.norm.weight.dtype)
        cos, sin = self.rotary.cos_sin(ctx.positions, x.dtype)
        if timers is not None:
            t0 = timers.add("embed", t0)
        layers = cast("Sequence[DecoderLayer]", self.layers)  # the ModuleList
        fast = decode_layers(layers, self.decode_weights, x, cos, sin, ctx) if self.kernels else None
        if fast is None:
            inner = timers.total(("routing", "experts")) if timers is not None else 0.0
            pending: torch.Tensor | None = None  # the last block's MLP output, its residual add not yet done
            if layers and all(layer.fuses_residuals(x) for layer in layers) and self.norm.use_kernels \
                    and not self.norm.batch_invariant:
                for layer in layers:  # each residual add done with the next norm (DecoderLayer.forward_parts)
                    x, pending = layer.forward_parts(x, pending, cos, sin, ctx)
            else:
                for layer in layers:
                    x = layer(x, cos, sin, ctx)
            if timers is not None:  # the MoE blocks charged their own part
                t0 = timers.add("layers", t0, less=timers.total(("routing", "experts")) - inner)
            if pending is not None:  # the last residual add and the final norm in one pass
                out = cpu_kernels.add_rms_norm(x, pending, self.norm.weight, self.norm.eps)[1]
                if timers is not None:
                    timers.add("final_norm", t0)
                return out
        else:
            x = fast
            t0 = timers.now() if timers is not None else 0.0
        out = self.norm(x)
        if timers is not None:
            timers.add("final_norm", t0)
        return out

    def decode_weights(self) -> DecodeWeights:
        """The whole-layer decode path's checked weights (``model/decode_path.py``), built once."""
        if self._decode_weights is None:
            self._decode_weights = DecodeWeights.build(cast("Sequence[DecoderLayer]", self.layers))  # the ModuleList
        return self._decode_weights

    def drop_decode_weights(self) -> None:
        """Forget the decode path's weight pointers; call after replacing (not copying into) parameters."""
        self._decode_weights = None

    def _apply(self, fn, recurse=True):
        self.drop_decode_weights()  # .to() / .float() may replace every parameter
        return super()._apply(fn, recurse)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[n, vocab]`` for hidden states ``[n, H]`` (matmul in the model dtype, or
        in ``head_format``: ``model/weight_formats.py``)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if self.head_format is not None:
            return formats.linear(hidden, weight, self.head_format)
        if self.batch_invariant:
            from execstate.kernels.gpu.grouped_mm import linear

            return linear(hidden, weight).float()
        bf16 = weight.dtype is not hidden.dtype  # bf16 weights, fp32 activations (model/bf16_weights.py)
        if self.kernels:
            logits = cpu_kernels.linear_bf16_if_small(hidden, weight) if bf16 else cpu_kernels.linear_if_small(
                hidden, weight)
            if logits is not None:
                return logits
        return linear_mixed(hidden, weight) if bf16 else F.linear(hidden, weight).float()
