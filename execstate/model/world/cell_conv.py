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

Options (``WorldModelConfig``): ``conv_layers`` stem convolutions (the first maps the sources to
``hidden`` channels, each further one is residual, ``x + gelu(conv(x))``, so a deeper stem starts
close to the shallow one); ``conv_keys``: the frame's keys as constant input channels (one-hot
per frame slot of the chunk, slots after the frame zero: the cumulative move, as the
transformer's action embedding), so "the agent takes the key's step unless a wall is there"
is one local rule instead of something inferred by comparing the shifted carry with the carry;
``conv_prev_frame``: frame ``f``'s stem also sees frame ``f - 1``'s noisy input (zeros for the
first frame, whose previous frame is the carry), so a later sampler iteration can make frame
``f`` follow the estimate of frame ``f - 1`` locally instead of predicting two moves ahead.

Shapes: the stem takes per-frame *sources* ``[N, P, S, grid*grid*C]`` (S stacked inputs: the
noisy chunk, each carry frame, the shifted carry, optionally the previous frame's noisy input)
and optional constant channels ``[N, E]``, and returns ``[N, P, grid*grid*hidden]``; the head
takes ``[N, P, grid*grid*hidden]`` and returns ``[N, P, grid*grid*C]`` (logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from execstate.model.world.shift import patchify, unpatchify


class CellConvStem(nn.Module):
    def __init__(self, sources: int, channels: int, hidden: int, grid: int, layers: int = 2,
                 extra: int = 0) -> None:
        super().__init__()
        if layers < 2:
            raise ValueError(f"a stem has at least 2 convolutions, got {layers}")
        self.grid, self.channels, self.extra = grid, channels, extra
        self.conv1 = nn.Conv2d(sources * channels + extra, hidden, 3, padding=1)
        self.conv2 = nn.Conv2d(hidden, hidden, 3, padding=1)
        self.more = nn.ModuleList(nn.Conv2d(hidden, hidden, 3, padding=1) for _ in range(layers - 2))

    def forward(self, sources: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        n, p, s, _ = sources.shape
        units = unpatchify(sources.transpose(1, 2), self.grid, self.channels)  # [N, S, H, W, C]
        h, w = units.shape[2:4]
        x = units.permute(0, 1, 4, 2, 3).reshape(n, s * self.channels, h, w)
        if self.extra:
            if extra is None or extra.shape != (n, self.extra):
                raise ValueError(f"the stem needs {self.extra} constant channels per frame")
            x = torch.cat([x, extra.to(x.dtype)[:, :, None, None].expand(n, self.extra, h, w)], dim=1)
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))
        for conv in self.more:
            x = x + F.gelu(conv(x))
        return patchify(x.permute(0, 2, 3, 1), self.grid)


class CellConvHead(nn.Module):
    def __init__(self, hidden: int, channels: int, grid: int) -> None:
        super().__init__()
        self.grid, self.hidden = grid, hidden
        self.conv = nn.Conv2d(hidden, channels, 3, padding=1)
        nn.init.zeros_(self.conv.weight)
        assert self.conv.bias is not None  # Conv2d's bias=True
        nn.init.zeros_(self.conv.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = unpatchify(h, self.grid, self.hidden)  # [N, H, W, hidden]
        x = self.conv(F.gelu(x).permute(0, 3, 1, 2))
        return patchify(x.permute(0, 2, 3, 1), self.grid)
