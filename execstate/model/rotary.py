"""Rotary position embedding (RoPE), with the scaling variants of the supported families.

Frequencies follow transformers 5.23 (``modeling_rope_utils``) exactly for ``default``,
``linear``, ``llama3`` and ``yarn``: the same fp32 formulas, so cos/sin tables are
bitwise identical. ``dynamic`` and ``longrope`` are rejected by ``ModelConfig``: their
frequencies depend on the longest sequence seen so far, which a cache cannot key on.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from execstate.model.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies fp32 ``[head_dim // 2]`` on CPU, attention scaling of cos/sin)."""
    dim = config.head_dim
    base = config.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    params = config.rope_scaling
    if params is None:
        return inv_freq, 1.0
    rope_type = params["rope_type"]
    if rope_type == "linear":
        return inv_freq / params["factor"], 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, params), 1.0
    if rope_type == "yarn":
        return _yarn(config, params)
    raise ValueError(f"unsupported rope_type {rope_type!r}")


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(config: ModelConfig, p: dict) -> tuple[torch.Tensor, float]:
    dim, base = config.head_dim, config.rope_theta
    orig = p["original_max_position_embeddings"]
    factor = p.get("factor")
    if factor is None:
        factor = config.max_position_embeddings / orig

    def get_mscale(scale: float, mscale: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    inv_freq = interpolation * (1 - extra_factor) + extrapolation * extra_factor
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Computes cos/sin for a flat batch of absolute positions and applies them to q/k.

    ``cos_sin(positions, dtype)`` is computed once per forward and shared by all layers;
    ``apply`` rotates ``[T, heads, head_dim]`` tensors (half-split "rotate_half" layout, as
    in HF checkpoints). ``inv_freq`` is a non-persistent fp32 buffer (created on CPU even
    when the module is built on the meta device; move the model with ``.to(device)``).
    """

    inv_freq: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inv_freq, scaling = rope_inv_freq(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = scaling

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape ``[T, 1, head_dim]`` in ``dtype`` for ``positions`` ``[T]``."""
        freqs = positions[:, None].float() * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    # Shadows nn.Module.apply(fn), which nothing calls on a model; the model's layers call this one.
    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin
