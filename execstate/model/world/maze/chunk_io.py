"""A maze model's chunk at the interface (both maze models: ``model.py``, ``state/model.py``):
frames to latents and back (RGB in ``[-1, 1]``) and one chunk's actions checked. The pool slots of
a context's chunks: ``model/world/context_slots.py`` (every world model's)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from execstate.model.world.interface import ChunkActions, WorldSpec
from execstate.model.world.maze.pose import PITCH_LIMIT


def encode_frames(spec: WorldSpec, frames: np.ndarray) -> torch.Tensor:
    frames = np.asarray(frames)
    want = (spec.frames_per_chunk, *spec.frame_shape)
    if frames.shape != want or frames.dtype != np.uint8:
        raise ValueError(f"a chunk of frames must be uint8{list(want)}, got {frames.dtype}{list(frames.shape)}")
    return torch.from_numpy(frames.astype(np.float32) / 127.5 - 1.0)


def decode(spec: WorldSpec, latents: torch.Tensor) -> np.ndarray:
    if tuple(latents.shape) != spec.chunk_latent_shape:
        raise ValueError(f"chunk latents must have shape {spec.chunk_latent_shape}")
    return ((latents.detach().to(torch.float32).clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8).numpy()


def make_actions(spec: WorldSpec, keys: Sequence[int], camera: Sequence[Sequence[float]] | None) -> ChunkActions:
    """``keys``: F key ids; ``camera``: F rows of (yaw, pitch, change of yaw, change of pitch) in
    radians (None: all zero, a session that never turned)."""
    f, n_keys = spec.frames_per_chunk, len(spec.keys)
    k = torch.as_tensor(np.asarray(keys, dtype=np.int64))
    if k.shape != (f,) or bool(((k < 0) | (k >= n_keys)).any()):
        raise ValueError(f"a chunk needs {f} keys in [0, {n_keys}), got {list(np.asarray(keys))}")
    cam = torch.zeros((f, 4)) if camera is None else torch.as_tensor(np.asarray(camera, dtype=np.float32))
    if cam.shape != (f, 4) or not bool(torch.isfinite(cam).all()):
        raise ValueError(f"camera must be {f} rows of 4 finite numbers (yaw, pitch, their changes)")
    if bool((cam[:, 1].abs() > PITCH_LIMIT + 1e-6).any()):
        raise ValueError(f"pitch must be within +-{PITCH_LIMIT:.4f} rad")
    return ChunkActions(k, cam)
