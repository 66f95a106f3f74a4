"""Rotary position over the frame index (time only; the spatial position is a learned embedding).

Positions are assigned *within the attended context*, not absolutely: the context's chunks get
frames ``0 .. n_ctx_frames - 1`` in context order (sink first, then the kept window, oldest
first) and the chunk being generated continues at ``n_ctx_frames``. So the largest position is
``(sink_chunks + window_chunks + 1) * frames_per_chunk - 1`` however long a session runs, which
is exactly the range training covers (training samples put a random gap between the sink and the
window, so "sink right before the window" is seen with every real distance behind it). This is
StreamingLLM's choice (positions within the cache) and Self-Forcing's rolling window's intent;
because K is stored *un-rotated* in the pool and rotated when a step gathers its context, a
slide of the window is a block-table change with no re-write of cached K.
"""

from __future__ import annotations

import torch


def tables(frame_pos: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``float32[len(frame_pos), head_dim]`` for per-token frame positions."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = frame_pos.to(torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(torch.float32), ang.sin().to(torch.float32)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [..., T, H, D]`` rotated by per-token tables ``[T, D]`` (rotate-half convention)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def token_frame_positions(n_frames: int, start: int, tokens_per_frame: int) -> torch.Tensor:
    """``int64[n_frames * tokens_per_frame]``: frame position of each token (frame-major layout)."""
    return torch.arange(start, start + n_frames).repeat_interleave(tokens_per_frame)
