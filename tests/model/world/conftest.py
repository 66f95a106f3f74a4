"""Fixtures for the world model tests: a tiny random world model (no training, no files)."""

from __future__ import annotations

import pytest
import torch

from execstate.model.world.config import WorldModelConfig
from execstate.model.world.model import ChunkedWorldModel
from execstate.model.world.transformer import WorldTransformer

TINY = WorldModelConfig(d_model=32, n_layers=2, n_heads=2, frames_per_chunk=2, text_dim=16, text_buckets=64,
                        window_chunks=2, action_shift_px=4)


def random_net(cfg: WorldModelConfig = TINY, seed: int = 0) -> WorldTransformer:
    """Random weights everywhere (also the zero-initialised gates and output layer, so every
    part of the network influences the output and the K/V)."""
    torch.manual_seed(seed)
    net = WorldTransformer(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.2)
    net.eval()
    return net


@pytest.fixture(scope="module")
def tiny_model() -> ChunkedWorldModel:
    return ChunkedWorldModel(random_net(), weights_version="tiny-random")
