"""The world model's codec, chosen by ``WorldModelConfig.codec``: one object the model, the
training data and the loss all go through, so the two latent spaces never mix.

- ``"patch"`` (:mod:`codec`): latents are pixel patches in ``[-1, 1]``; the network's output is
  the predicted patch (x-prediction); loss: weighted MSE; ``snap`` is the identity.
- ``"palette"`` (:mod:`palette_codec`): latents are one-hot palette cells; the network's output
  is per-cell logits; loss: weighted cross-entropy; ``snap`` turns logits into the one-hot latent
  of the decoded frame.

A latent token is a ``grid x grid`` square of *units* (pixels, or cells) of ``channels`` values
each, laid out (row, column, channel); the action-shifted carry (:mod:`shift`) moves latents
by whole units, ``action_shift_px`` units per world cell.
"""

from __future__ import annotations

import numpy as np
import torch

from execstate.model.world import codec, palette_codec
from execstate.model.world.config import WorldModelConfig


class LatentCodec:
    def __init__(self, cfg: WorldModelConfig) -> None:
        self.kind, self.patch, self.cell = cfg.codec, cfg.patch_size, cfg.cell_size
        self.grid, self.channels, self.dim = cfg.latent_grid, cfg.latent_channels, cfg.latent_dim

    def encode(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``uint8[..., H, W, 3]`` -> ``float32[..., tokens, dim]``."""
        if self.kind == "palette":
            return palette_codec.encode(frames, self.patch, self.cell)
        return codec.encode(frames, self.patch)

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Latents (or the network's raw output) ``[..., tokens, dim]`` -> ``uint8[..., H, W, 3]``."""
        if self.kind == "palette":
            return palette_codec.decode(latents, self.patch, self.cell)
        return codec.decode(latents, self.patch)

    def snap(self, out: torch.Tensor) -> torch.Tensor:
        """The network's raw output -> a clean latent (what is committed and carried)."""
        if self.kind == "palette":
            return palette_codec.snap(out, self.patch, self.cell)
        return out

    def unit_mask(self, changed: torch.Tensor) -> torch.Tensor:
        """bool ``[..., tokens, dim]`` per latent value -> ``[..., tokens, grid*grid]`` per unit (any
        of its channels)."""
        return changed.reshape(*changed.shape[:-1], self.grid * self.grid, self.channels).any(-1)

    def loss(self, out: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Weighted mean loss; ``weight [..., tokens, grid*grid]`` per unit."""
        if self.kind == "palette":
            return palette_codec.loss(out, target, weight)
        w = weight[..., None].expand(*weight.shape, self.channels).reshape(target.shape)
        return (w * (out.to(torch.float32) - target) ** 2).sum() / w.sum()
