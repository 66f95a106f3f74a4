"""Rotary positions of the maze model: time within the context, and the world angle a token looks at.

Each head's rotary pairs are split: the first ``time_pairs`` rotate with the token's frame
position *within the context* (as ``model/world/rope.py``: the sink first, the kept window in
order, the new chunk after them, so positions stay in the trained range however long a session
runs); the others rotate with the *world angle* of the token's strip (the session-relative yaw of
its frame plus the strip's offset in the field of view) at whole frequencies ``1 .. n`` per turn,
so a full turn is exactly the identity: a strip attends to what context strips saw at the same
angle as to a relative position 0 (looking back at a place after turning round needs no learnt
arithmetic).

The two parts touch disjoint dimensions, so they commute: the pool stores keys rotated by their
angle (which never changes once a frame is committed) and a step rotates the gathered keys by
their time positions in its context; queries get both. Tables are ``float32[T, head_dim]``
(rotate-half convention, ``rope.rotate``).
"""

from __future__ import annotations

import torch

from execstate.model.world.rope import TIME_BASE


def _pairs(head_dim: int, time_pairs: int) -> tuple[int, int]:
    return time_pairs, head_dim // 2 - time_pairs


def _tables(ang: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(torch.float32), ang.sin().to(torch.float32)


def time_tables(frame_pos: torch.Tensor, head_dim: int, time_pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation by time positions ``frame_pos [T]`` only (the angle pairs are left as they are)."""
    tp, ap = _pairs(head_dim, time_pairs)
    inv = TIME_BASE ** (-torch.arange(tp, dtype=torch.float64) / tp)
    fp = frame_pos.to(torch.float64)[..., None]
    ang = torch.cat([fp * inv, torch.zeros((*frame_pos.shape, ap), dtype=torch.float64)], dim=-1)
    return _tables(ang)


def angle_tables(angles: torch.Tensor, head_dim: int, time_pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation by world angles ``angles [..., T]`` (radians) only (the time pairs are left as they are)."""
    tp, ap = _pairs(head_dim, time_pairs)
    freq = torch.arange(1, ap + 1, dtype=torch.float64)
    ang = torch.cat([torch.zeros((*angles.shape, tp), dtype=torch.float64),
                     angles.to(torch.float64)[..., None] * freq], dim=-1)
    return _tables(ang)


def both_tables(frame_pos: torch.Tensor, angles: torch.Tensor, head_dim: int,
                time_pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Time and angle together (what queries and a chunk's own keys get); ``angles [T]`` or
    ``[B, T]`` (per-sample tables ``[B, T, Dh]``)."""
    tc, ts = time_tables(frame_pos, head_dim, time_pairs)
    ac, as_ = angle_tables(angles, head_dim, time_pairs)
    tp = time_pairs
    half = head_dim // 2
    sel = torch.zeros(half, dtype=torch.bool)
    sel[:tp] = True
    sel = torch.cat([sel, sel])
    return torch.where(sel, tc, ac), torch.where(sel, ts, as_)


def strip_angles(frame_yaw: torch.Tensor, tokens_per_frame: int, strip: int, dtheta: float) -> torch.Tensor:
    """The world angle at the centre of each strip: ``frame_yaw [..., F]`` -> ``[..., F * tokens_per_frame]``."""
    offsets = (torch.arange(tokens_per_frame, dtype=torch.float64) + 0.5 - tokens_per_frame / 2) * strip * dtheta
    return (frame_yaw.to(torch.float64)[..., None] + offsets).flatten(-2)
