"""Convolutions over the latent unit grid around the transformer (``WorldModelConfig.conv_channels``).

A latent token is a ``grid x grid`` square of units (palette cells); the rules of the world are
local in units, not tokens (a mover steps into the next cell, the agent stops at a wall one cell
away, and either may cross a token's edge). Two 3 x 3 convolutions over the whole frame's unit
grid before the tokens are formed (the *stem*) give every token the neighbourhood of each of its
units, across token edges; one 3 x 3 convolution after them (the *head*) lets each unit's output
see its neighbours' hidden state. The stem's unit features also skip the transformer and are
added to the head's input (a U-Net skip), so the local rules (a mover continues its step, the
agent takes the key's step unless a wall is there) have a path of three convolutions that does
not go through the token bottleneck. This is the convolutional patch embedding and decoder of
hybrid ViTs; the transformer still does everything that is not local (attention to the cached
context, the prompt, the actions).

Shapes: the stem takes per-frame *sources* ``[N, P, S, grid*grid*C]`` (S stacked inputs: the
noisy chunk, each carry frame, the shifted carry) and returns ``[N, P, grid*grid*hidden]``; the
head takes ``[N, P, grid*grid*hidden]`` and returns ``[N, P, grid*grid*C]`` (logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from execstate.model.world.shift import patchify, unpatchify


class CellConvStem(nn.Module):
    def __init__(self, sources: int, channels: int, hidden: int, grid: int) -> None:
        super().__init__()
        self.grid, self.channels = grid, channels
        self.conv1 = nn.Conv2d(sources * channels, hidden, 3, padding=1)
        self.conv2 = nn.Conv2d(hidden, hidden, 3, padding=1)

    def forward(self, sources: torch.Tensor) -> torch.Tensor:
        n, p, s, _ = sources.shape
        units = unpatchify(sources.transpose(1, 2), self.grid, self.channels)  # [N, S, H, W, C]
        h, w = units.shape[2:4]
        x = units.permute(0, 1, 4, 2, 3).reshape(n, s * self.channels, h, w)
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))
        return patchify(x.permute(0, 2, 3, 1), self.grid)


class CellConvHead(nn.Module):
    def __init__(self, hidden: int, channels: int, grid: int) -> None:
        super().__init__()
        self.grid, self.hidden = grid, hidden
        self.conv = nn.Conv2d(hidden, channels, 3, padding=1)
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = unpatchify(h, self.grid, self.hidden)  # [N, H, W, hidden]
        x = self.conv(F.gelu(x).permute(0, 3, 1, 2))
        return patchify(x.permute(0, 2, 3, 1), self.grid)
