"""A tiny random maze world model (no training, no files) for the maze tests (a helper module, not a
conftest: the grid world's tests import their ``conftest`` by name)."""

from __future__ import annotations

import torch

from execstate.model.world.maze.config import MazeModelConfig
from execstate.model.world.maze.network import MazeNet

TINY_MAZE = MazeModelConfig(d_model=32, n_layers=2, n_heads=2, time_pairs=2, text_dim=16, text_buckets=64,
                            window_chunks=3, conv_channels=(4, 8), token_features=2)


def random_maze_net(cfg: MazeModelConfig = TINY_MAZE, seed: int = 0) -> MazeNet:
    """Random weights everywhere (the zero-initialised layers too, so every part counts)."""
    torch.manual_seed(seed)
    net = MazeNet(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.15)
    net.eval()
    return net

