"""Teacher forcing for the maze model: windows of trajectories as block-causal chunk sequences.

A sample is the sink (the trajectory's first chunk, as a session starts) and ``K`` consecutive
chunks from later on (a random gap between: the rolling window's layout). The sequence holds the
clean chunks the targets attend to (sink .. second-to-last) and a noisy copy of each target chunk;
chunk-level attention, then expanded to tokens:

- clean chunk ``i`` attends to clean chunks ``j <= i`` (what a commit pass sees);
- the noisy copy of chunk ``i`` attends to clean chunks ``j < i`` and to itself (a denoise step).

Clean and noisy copies share time positions (``i * F + frame``, within the context as a session
assigns them), world angles, keys, camera and carry (the frame before the chunk; black before the
sink). ``context`` may replace the clean frames (the model's own earlier outputs), the targets stay
the renderer's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from execstate.model.world.maze import positions
from execstate.model.world.maze.config import MazeModelConfig
from execstate.model.world.maze.network import MazeNet
from execstate.model.world.maze.pose import DTHETA
from execstate.model.world.prompt import word_ids
from execstate.model.world.rope import token_frame_positions
from execstate_bench.world_tools.maze_data import Trajectory


@dataclass(frozen=True)
class Batch:
    frames: torch.Tensor  # [B, G, F, H, W, 3] in [-1, 1]: the sink then the window's chunks (truth)
    carry: torch.Tensor  # [B, G, H, W, 3]
    keys: torch.Tensor  # int64 [B, G, F]
    camera: torch.Tensor  # [B, G, F, 4]
    word_ids: torch.Tensor  # int64 [B, Tt]
    word_mask: torch.Tensor  # bool [B, Tt]


def to_unit(frames: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(frames.astype(np.float32) / 127.5 - 1.0)


def prompt_ids(prompts: list[str], cfg: MazeModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [word_ids(p, cfg.text_buckets, cfg.max_prompt_words) for p in prompts]
    n = max(len(i) for i in ids)
    out = torch.zeros((len(ids), n), dtype=torch.int64)
    mask = torch.zeros((len(ids), n), dtype=torch.bool)
    for r, i in enumerate(ids):
        out[r, : len(i)] = torch.tensor(i)
        mask[r, : len(i)] = True
    return out, mask


def window_batch(trajs: list[Trajectory], starts: list[int], k: int, cfg: MazeModelConfig) -> Batch:
    """The sink and chunks ``starts[b] .. starts[b] + k - 1`` of each trajectory (``starts >= 1``)."""
    f = cfg.frames_per_chunk
    fr, ca, ke, cm = [], [], [], []
    for tr, s in zip(trajs, starts, strict=True):
        idx = [0, *range(s, s + k)]
        frames = np.stack([tr.frames(c * f, (c + 1) * f) for c in idx])
        carry = np.stack([tr.frame(max(c * f - 1, 0)) for c in idx])
        fr.append(to_unit(frames))
        ca.append(to_unit(carry))
        ca[-1][0] = -1.0  # nothing before the sink (the model's initial carry)
        ke.append(torch.from_numpy(np.stack([tr.keys[c * f : (c + 1) * f] for c in idx])))
        cm.append(torch.from_numpy(np.stack([tr.camera[c * f : (c + 1) * f] for c in idx])))
    ids, mask = prompt_ids([t.prompt for t in trajs], cfg)
    return Batch(torch.stack(fr), torch.stack(ca), torch.stack(ke), torch.stack(cm), ids, mask)


def sequence_mask(g: int, tpc: int) -> torch.Tensor:
    """bool ``[(2g - 1) * tpc, (2g - 1) * tpc]``: clean chunks ``0 .. g - 2``, then noisy copies of
    chunks ``1 .. g - 1`` (module docstring)."""
    n_clean, n_noisy = g - 1, g - 1
    m = torch.zeros((n_clean + n_noisy, n_clean + n_noisy), dtype=torch.bool)
    i = torch.arange(n_clean)
    m[:n_clean, :n_clean] = i[None, :] <= i[:, None]
    tgt = torch.arange(1, g)  # the chunk index of each noisy copy
    m[n_clean:, :n_clean] = i[None, :] < tgt[:, None]
    m[n_clean:, n_clean:] = torch.eye(n_noisy, dtype=torch.bool)
    return m.repeat_interleave(tpc, 0).repeat_interleave(tpc, 1)


def predict(net: MazeNet, batch: Batch, context: torch.Tensor | None = None,
            local_only: bool = False, carry: torch.Tensor | None = None) -> torch.Tensor:
    """Predicted frames of chunks ``1 .. G - 1`` (``[B, G - 1, F, H, W, 3]``) at flow time 0 (the
    recipe's one-step sampler). ``context`` (like ``batch.frames``) replaces the clean frames and the
    carries that follow from them; ``carry`` (like ``batch.carry``) replaces the carries."""
    cfg = net.cfg
    b, g, f, h, w, _ = batch.frames.shape
    p = cfg.tokens_per_frame
    clean = batch.frames if context is None else context
    carry = batch.carry if carry is None else carry
    if context is not None:  # each chunk's carry: the last frame of the chunk before, if contiguous
        carry = carry.clone()
        carry[:, 2:] = context[:, 1:-1, -1]
    noisy = torch.zeros_like(batch.frames[:, 1:])
    if local_only:
        out, _, _ = net(noisy, carry[:, 1:], torch.zeros((b, g - 1)), batch.keys[:, 1:], batch.camera[:, 1:],
                        None, None, None, None, None, None, None, None, local_only=True)
        return out
    sel = torch.cat([torch.arange(g - 1), torch.arange(1, g)])  # the chunk of each sequence group
    x = torch.cat([clean[:, : g - 1], noisy], dim=1)
    t = torch.cat([torch.ones((b, g - 1)), torch.zeros((b, g - 1))], dim=1)
    pos = torch.cat([token_frame_positions(f, int(c) * f, p) for c in sel])
    yaw = batch.camera[:, sel, :, 0]  # [B, S, F]
    ang = positions.strip_angles(yaw, p, cfg.strip, DTHETA).reshape(b, -1)
    cos, sin = positions.both_tables(pos.expand(b, -1), ang, cfg.head_dim, cfg.time_pairs)
    pk, pv = net.prompt_kv(batch.word_ids.repeat_interleave(2 * g - 2, 0))
    pmask = batch.word_mask.repeat_interleave(2 * g - 2, 0)
    out, _, _ = net(x, carry[:, sel], t, batch.keys[:, sel], batch.camera[:, sel], cos, sin, None, None,
                    sequence_mask(g, cfg.tokens_per_chunk), pk, pv, pmask, out_groups=g - 1)
    return out
