"""Pixels <-> palette-cell latents: the world model's categorical codec (``codec = "palette"``).

The world is pixel art: every ``cell x cell`` square of a frame has one colour out of a fixed
palette (:data:`PALETTE`: the floor and wall of every theme, the agent, the movers). The codec
is a vector quantiser whose codebook is that palette (a VQ tokenizer with a fixed codebook):

- **encode**: each cell's mean colour -> the nearest palette entry -> a one-hot over the
  ``K`` entries, scaled to ``{-1, +1}``; a latent token holds a ``g x g`` square of cells
  (``g = patch_size / cell``), laid out (row, column, entry) like a pixel patch
  (row, column, channel), so ``float32[..., tokens, g*g*K]``;
- **decode**: per cell, the entry with the largest value (a model's logits or a snapped
  latent) -> its colour, repeated over the cell; ``decode(encode(x)) == x`` for every frame
  the renderer draws;
- **snap**: a prediction -> the latent of its decoded frame (one-hot of the argmax), so what a
  rollout commits to its cache and carry is always a valid frame: no continuous error can
  accumulate step after step, only whole-cell mistakes (the discrete-token argument of
  autoregressive LMs, applied to frames);
- **loss**: cross-entropy per cell between the predicted logits and the target entry,
  weighted per cell.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from execstate.model.world import renderer
from execstate.model.world.codec import checked_frames

PALETTE = np.array(
    [c for pair in renderer.THEMES.values() for c in pair] + [renderer.AGENT_RGB, *renderer.MOVER_RGB], np.uint8)
K = len(PALETTE)


def cell_indices(frames: np.ndarray | torch.Tensor, cell: int) -> torch.Tensor:
    """``uint8[..., H, W, 3]`` -> ``int64[..., H/cell, W/cell]``: each cell's nearest palette entry."""
    x = checked_frames(frames, cell, "cell size")
    *lead, h, w, _ = x.shape
    mean = x.to(torch.float32).reshape(*lead, h // cell, cell, w // cell, cell, 3).mean(dim=(-4, -2))
    dist = ((mean[..., None, :] - torch.as_tensor(PALETTE, dtype=torch.float32)) ** 2).sum(-1)
    return dist.argmin(-1)


def _tokens(cells: torch.Tensor, g: int) -> torch.Tensor:
    """``[..., n*g, n*g, C]`` -> ``[..., n*n, g*g*C]`` (patch order, like codec.encode)."""
    *lead, h, w, c = cells.shape
    x = cells.reshape(*lead, h // g, g, w // g, g, c).movedim(-4, -3)
    return x.reshape(*lead, (h // g) * (w // g), g * g * c)


def _cells(latents: torch.Tensor, g: int) -> torch.Tensor:
    """Inverse of :func:`_tokens`: ``[..., n*n, g*g*K]`` -> ``[..., n*g, n*g, K]``."""
    *lead, tokens, dim = latents.shape
    side = int(round(tokens**0.5))
    if side * side != tokens or dim != g * g * K:
        raise ValueError(f"latents {tuple(latents.shape)} do not hold square frames of {g}x{g}-cell tokens "
                         f"over a {K}-colour palette")
    x = latents.reshape(*lead, side, side, g, g, K).movedim(-4, -3)
    return x.reshape(*lead, side * g, side * g, K)


def encode(frames: np.ndarray | torch.Tensor, patch: int, cell: int) -> torch.Tensor:
    """``uint8[..., H, W, 3]`` -> ``float32[..., tokens, g*g*K]`` in ``{-1, +1}``."""
    if patch % cell:
        raise ValueError(f"patch size {patch} is not a multiple of the cell size {cell}")
    onehot = F.one_hot(cell_indices(frames, cell), K).to(torch.float32)
    return _tokens(onehot * 2.0 - 1.0, patch // cell)


def decode(latents: torch.Tensor, patch: int, cell: int) -> np.ndarray:
    """Latents or logits ``[..., tokens, g*g*K]`` -> ``uint8[..., H, W, 3]``."""
    idx = _cells(latents.detach().to(torch.float32), patch // cell).argmax(-1)
    pix = torch.as_tensor(PALETTE)[idx]
    return pix.repeat_interleave(cell, dim=-3).repeat_interleave(cell, dim=-2).numpy()


def snap(out: torch.Tensor, patch: int, cell: int) -> torch.Tensor:
    """Logits ``[..., tokens, g*g*K]`` -> the latent of the decoded frame (one-hot of the argmax, +-1)."""
    g = patch // cell
    x = out.reshape(*out.shape[:-1], g * g, K)
    onehot = F.one_hot(x.argmax(-1), K).to(torch.float32)
    return (onehot * 2.0 - 1.0).reshape(out.shape)


def loss(out: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted mean cross-entropy per cell. ``out`` logits and ``target`` latents
    ``[..., tokens, cells*K]``; ``weight`` ``[..., tokens, cells]``."""
    logits = out.reshape(*out.shape[:-1], -1, K).to(torch.float32)
    labels = target.reshape(*target.shape[:-1], -1, K).argmax(-1)
    ce = F.cross_entropy(logits.reshape(-1, K), labels.reshape(-1), reduction="none").view(labels.shape)
    return (weight * ce).sum() / weight.sum()
