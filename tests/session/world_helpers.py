"""Tiny random world models and helpers for the world-session tests (no training, no files)."""

from __future__ import annotations

import numpy as np
import torch

from execstate.model.world.config import WorldModelConfig
from execstate.model.world.model import ChunkedWorldModel
from execstate.model.world.transformer import WorldTransformer
from execstate.session.world.offline import World, WorldSession

TINY = WorldModelConfig(frame_size=24, patch_size=12, d_model=32, n_layers=2, n_heads=2, frames_per_chunk=2,
                        text_dim=16, text_buckets=64, window_chunks=2)
TINY_CAMERA = WorldModelConfig(frame_size=24, patch_size=12, d_model=32, n_layers=2, n_heads=2, frames_per_chunk=2,
                               text_dim=16, text_buckets=64, window_chunks=2, camera_dim=2)


def tiny_world_model(cfg: WorldModelConfig = TINY, seed: int = 0, numerics: str = "eager") -> ChunkedWorldModel:
    """Random weights everywhere (the zero-initialised gates and output layer too, so every part
    of the network influences frames and K/V)."""
    torch.manual_seed(seed)
    net = WorldTransformer(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.2)
    net.eval()
    return ChunkedWorldModel(net, weights_version=f"tiny-random-{seed}", numerics=numerics)


def start_frames(cfg: WorldModelConfig = TINY, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (cfg.frames_per_chunk, cfg.frame_size, cfg.frame_size, 3), dtype=np.uint8)


def table_kv(world: World, s: WorldSession) -> list[bytes]:
    """The K/V bytes of each chunk of the session's block table, sink first."""
    store = world.sessions.store
    state = world.sessions.runtime(s.session_id).state
    out = []
    for rec in state.table:
        slots = torch.cat([torch.arange(store.block_size) + b * store.block_size for b in rec.block_ids])
        out.append(store.kv.k[:, slots].numpy().tobytes() + store.kv.v[:, slots].numpy().tobytes())
    return out


def run(s: WorldSession, plan: list[list[tuple[str, dict]]]) -> list[str]:
    """Per step: submit its events (next ids), step; the frames' sha256 of each step."""
    out = []
    for events in plan:
        for kind, data in events:
            s.submit_event(s.next_event_id(), kind, data)
        out.append(s.step().frames_sha256)
    return out
