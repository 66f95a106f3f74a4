"""Rotary position over (time, row, column) of each token, with time assigned *within the context*.

The head dimension is split into rotary pairs: ``head_dim // 8`` pairs rotate with the token's
frame position, the rest (half each) with its patch row and column in the frame (spatial
positions are the same in every frame, so "the same place a frame earlier" is one relative
offset, easy to attend to).

Time positions are assigned *within the attended context*, not absolutely: the context's
chunks get frames ``0 .. n_ctx_frames - 1`` in context order (sink first, then the kept window,
oldest first) and the chunk being generated continues at ``n_ctx_frames``. So the largest
position is ``(sink_chunks + window_chunks + 1) * frames_per_chunk - 1`` however long a session
runs, which is the range training covers (training samples put a random gap between the sink
and the window, so "sink right before the window" is seen with every real distance behind it).
This is StreamingLLM's choice (positions within the cache). Because K is stored *un-rotated* in
the pool and rotated when a step gathers its context, a slide of the window is a block-table
change with no re-write of cached K.
"""

from __future__ import annotations

import torch

TIME_BASE = 100.0
SPACE_BASE = 10.0


def _angles(pos: torch.Tensor, pairs: int, base: float) -> torch.Tensor:
    inv = base ** (-torch.arange(pairs, dtype=torch.float64) / max(pairs, 1))
    return pos.to(torch.float64)[:, None] * inv[None, :]


def tables(frame_pos: torch.Tensor, tokens_per_frame: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``float32[T, head_dim]`` for tokens laid out frame-major with ``frame_pos[T]``."""
    pairs = head_dim // 2
    tp = max(1, head_dim // 8)
    sp = (pairs - tp) // 2
    tp = pairs - 2 * sp
    side = int(round(tokens_per_frame**0.5))
    p = torch.arange(len(frame_pos)) % tokens_per_frame
    ang = torch.cat([_angles(frame_pos, tp, TIME_BASE), _angles(p // side, sp, SPACE_BASE),
                     _angles(p % side, sp, SPACE_BASE)], dim=-1)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(torch.float32), ang.sin().to(torch.float32)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [..., T, H, D]`` rotated by per-token tables ``[T, D]`` (or ``[B, T, D]`` for ``x [B, T, H, D]``:
    per-sample tables; rotate-half convention)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos[..., None, :] + rot * sin[..., None, :]


def token_frame_positions(n_frames: int, start: int, tokens_per_frame: int) -> torch.Tensor:
    """``int64[n_frames * tokens_per_frame]``: frame position of each token (frame-major layout)."""
    return torch.arange(start, start + n_frames).repeat_interleave(tokens_per_frame)
