"""Action-shifted carry: the newest carry frame translated by each frame's cumulative key move.

The keys of the procedural world translate the agent by one cell per frame (``KEY_MOVES``, in
cells; ``WorldModelConfig.action_shift_px`` pixels per cell). The network gets, per frame of a
chunk, the frame before the chunk shifted by the move of the keys up to that frame (the whole
frame, edge pixels repeated), next to the unshifted carry: where the agent would be if the move
succeeds is then a *local* feature of each patch token, and the network only has to pick the
agent from the shifted copy and everything else (walls, movers, floor) from the unshifted one,
and decide whether a wall blocks the move. This is the pixel-space analogue of warping the
previous frame by the camera motion for camera actions. It is a fixed, differentiable-free
gather (no parameters); ``action_shift_px = 0`` turns it off.
"""

from __future__ import annotations

import torch

KEY_MOVES = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))  # renderer.ACTIONS order: none, up, down, left, right


def unpatchify(latents: torch.Tensor, patch: int, channels: int = 3) -> torch.Tensor:
    """``[..., n*n, p*p*C]`` -> ``[..., n*p, n*p, C]`` (same values, unit layout)."""
    *lead, tokens, _ = latents.shape
    side = int(round(tokens**0.5))
    x = latents.reshape(*lead, side, side, patch, patch, channels).movedim(-4, -3)
    return x.reshape(*lead, side * patch, side * patch, channels)


def patchify(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """Inverse of :func:`unpatchify`."""
    *lead, h, w, c = pixels.shape
    x = pixels.reshape(*lead, h // patch, patch, w // patch, patch, c).movedim(-4, -3)
    return x.reshape(*lead, (h // patch) * (w // patch), patch * patch * c)


def shifted_carry(last: torch.Tensor, actions: torch.Tensor, frames_per_chunk: int, patch: int,
                  shift_px: int, channels: int = 3) -> torch.Tensor:
    """``last [B, G, P, latent_dim]`` (each group's newest carry frame), ``actions int64 [B, G*F]``
    -> ``[B, G, F, P, latent_dim]``: frame ``f`` of group ``g`` is ``last[:, g]`` moved by the sum
    of the key moves of frames ``0..f`` of the group. A token is ``patch x patch`` units (pixels,
    or palette cells) of ``channels`` values; ``shift_px`` units per world cell."""
    b, g = last.shape[:2]
    f = frames_per_chunk
    moves = torch.tensor(KEY_MOVES, dtype=torch.int64, device=last.device)[actions].view(b, g, f, 2).cumsum(2)
    pix = unpatchify(last, patch, channels)  # [B, G, H, W, C]
    h, w = pix.shape[2:4]
    rows = (torch.arange(h, device=last.device) - moves[..., 0:1] * shift_px).clamp(0, h - 1)  # [B, G, F, H]
    cols = (torch.arange(w, device=last.device) - moves[..., 1:2] * shift_px).clamp(0, w - 1)  # [B, G, F, W]
    bi = torch.arange(b, device=last.device).view(b, 1, 1, 1, 1)
    gi = torch.arange(g, device=last.device).view(1, g, 1, 1, 1)
    out = pix[bi, gi, rows[..., :, None], cols[..., None, :]]  # [B, G, F, H, W, C]
    return patchify(out, patch)
