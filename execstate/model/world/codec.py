"""Pixels <-> latents: the model's encoder/decoder.

The latent of a frame is its non-overlapping ``p x p`` patches, each flattened (row, column,
channel) and scaled from ``[0, 255]`` to ``[-1, 1]``: ``float32[tokens_per_frame, p*p*3]`` in
row-major patch order. For this pixel-art world a patch codec loses nothing (decode(encode(x)) ==
x exactly) and costs no training; a learned autoencoder (a VAE for real video) plugs in at the
same two functions (docs/world-model.md).
"""

from __future__ import annotations

import numpy as np
import torch


def checked_frames(frames: np.ndarray | torch.Tensor, unit: int, unit_name: str) -> torch.Tensor:
    """``frames`` as a tensor, after checking it is ``uint8[..., H, W, 3]`` with H and W multiples
    of ``unit`` (a ValueError naming the problem otherwise)."""
    x = torch.as_tensor(frames)
    if x.dtype != torch.uint8 or x.dim() < 3 or x.shape[-1] != 3:
        raise ValueError(f"frames must be uint8[..., H, W, 3], got {x.dtype} {tuple(x.shape)}")
    h, w = x.shape[-3:-1]
    if h % unit or w % unit:
        raise ValueError(f"frame {h}x{w} is not a multiple of the {unit_name} {unit}")
    return x


def encode(frames: np.ndarray | torch.Tensor, patch: int) -> torch.Tensor:
    """``uint8[..., H, W, 3]`` -> ``float32[..., (H/p)*(W/p), p*p*3]``."""
    x = checked_frames(frames, patch, "patch size")
    *lead, h, w, _ = x.shape
    x = x.reshape(*lead, h // patch, patch, w // patch, patch, 3).movedim(-4, -3)
    x = x.reshape(*lead, (h // patch) * (w // patch), patch * patch * 3)
    return x.to(torch.float32) / 127.5 - 1.0


def decode(latents: torch.Tensor, patch: int) -> np.ndarray:
    """``float[..., n*n, p*p*3]`` -> ``uint8[..., n*p, n*p, 3]`` (rounded, clipped)."""
    *lead, tokens, dim = latents.shape
    side = int(round(tokens**0.5))
    if side * side != tokens or dim != patch * patch * 3:
        raise ValueError(f"latents {tuple(latents.shape)} do not hold square frames of {patch}x{patch} patches")
    x = latents.detach().to(torch.float32).reshape(*lead, side, side, patch, patch, 3).movedim(-4, -3)
    x = x.reshape(*lead, side * patch, side * patch, 3)
    return ((x + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
