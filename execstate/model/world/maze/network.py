"""The maze world model's network: a chunk of frames from the frame before it, the keys, the
camera, the prompt and the cached context.

Two paths, added together at half resolution:

- **The local path** (a small U-Net over the pixels, ``conv_channels``): it sees the frame
  before the chunk (*carry*) *shifted by the camera's turn* (``shift.py``'s idea for a first-person
  view: with the raycaster's cylindrical camera, turning by one column's angle is a one-column
  shift, and pitch is a vertical shift, so rotation is exact and free), the mask of what that shift
  could not fill, the carry itself, the noisy frame, and the frame's keys and camera as constant
  planes. It does what is local: walls grow as the walker comes closer, slide by as it strafes,
  stop when it is blocked.
- **The transformer** over vertical strips (``strip`` columns, 16 tokens per frame): each token
  embeds its strip of the half-resolution inputs, the keys (cumulated over the chunk's frames, one
  table per frame slot, as in the grid model), the camera (pitch and the frame's change), its place
  in the view and the flow time (adaLN). Self-attention reaches the cached context (the sink and
  the window), rotated by time and *world angle* (``positions.py``), cross-attention the prompt
  (the theme). Its output becomes ``token_features`` channels of the strip's half-resolution
  pixels, entering the U-Net's middle: what the view shows where the carry had nothing (a place
  seen before, from the context; the theme) comes from here.

The output is gated on the shifted carry, per pixel: ``x1 = base + sigmoid(gate) * (value -
base)`` (the gate starts nearly closed: copy what turned into view, where the mask is 1). Frames
are RGB in ``[-1, 1]``, ``[..., H, W, 3]``.

:meth:`MazeNet.forward` serves training (a block-causal sequence of chunks) and inference (one
chunk with a gathered context) with the same code; it returns the predicted frames of the last
``out_groups`` groups and every token's un-rotated keys and values (what a commit stores, once
rotated by angle).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from execstate.model.world.maze.config import MazeModelConfig
from execstate.model.world.maze.pose import DTHETA
from execstate.model.world.network import Block

_T_FEATURES = 64
_GATE_INIT = -3.0


def _t_features(t: torch.Tensor) -> torch.Tensor:
    half = _T_FEATURES // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    ang = (t.to(torch.float32) * 1000.0)[..., None] * freqs
    return torch.cat([ang.cos(), ang.sin()], dim=-1)


def camera_features(camera: torch.Tensor) -> torch.Tensor:
    """``camera [..., 4]`` -> its pitch and change of yaw and pitch in units of 16 columns (about 1)."""
    return camera[..., 1:4] / (16.0 * DTHETA)


def shift_frames(frames: torch.Tensor, cols: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``frames [N, 3, H, W]`` moved so that output column ``c`` shows input column ``c + cols`` and
    output row ``r`` input row ``r - rows`` (bilinear, fractional shifts allowed); and the mask
    ``[N, 1, H, W]`` of output pixels the input covered (1) or not (0)."""
    n, _, h, w = frames.shape
    theta = torch.zeros((n, 2, 3), dtype=frames.dtype)
    theta[:, 0, 0] = 1.0
    theta[:, 1, 1] = 1.0
    theta[:, 0, 2] = 2.0 * cols.to(frames.dtype) / w
    theta[:, 1, 2] = -2.0 * rows.to(frames.dtype) / h
    grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)
    ones = torch.ones((n, 1, h, w), dtype=frames.dtype)
    out = F.grid_sample(torch.cat([frames, ones], 1), grid, mode="bilinear", padding_mode="zeros",
                        align_corners=False)
    mask = out[:, 3:]
    return out[:, :3] * (mask > 0.999), (mask > 0.999).to(frames.dtype)


class LocalPath(nn.Module):
    """The U-Net of the local path (module docstring)."""

    def __init__(self, cfg: MazeModelConfig, in_channels: int) -> None:
        super().__init__()
        c1, c2 = cfg.conv_channels
        self.enc = nn.Conv2d(in_channels, c1, 3, padding=1)
        self.down = nn.Conv2d(c1, c2, 3, stride=2, padding=1)
        self.mid1 = nn.Conv2d(c2 + cfg.token_features, c2, 3, padding=1)
        self.mid2 = nn.Conv2d(c2, c2, 3, padding=2, dilation=2)
        self.up = nn.Conv2d(c2 + c1, c1, 3, padding=1)
        self.head = nn.Conv2d(c1, 6, 3, padding=1)
        nn.init.zeros_(self.head.weight)
        bias = cast(torch.Tensor, self.head.bias)  # a Conv2d built with a bias
        with torch.no_grad():
            bias.zero_()
            bias[3:] = _GATE_INIT

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        e = F.gelu(self.enc(x))
        m = F.gelu(self.down(e))
        m = F.gelu(self.mid1(torch.cat([m, tokens], 1)))
        m = m + F.gelu(self.mid2(m))
        u = F.interpolate(m, scale_factor=2.0, mode="nearest")
        return self.head(F.gelu(self.up(torch.cat([u, e], 1))))


class MazeNet(nn.Module):
    def __init__(self, cfg: MazeModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, f, p = cfg.d_model, cfg.frames_per_chunk, cfg.tokens_per_frame
        self.token_in = nn.Linear(cfg.token_in, d)
        self.pos_strip = nn.Parameter(torch.randn(p, d) * 0.02)
        self.pos_frame = nn.Parameter(torch.randn(f, d) * 0.02)
        self.key_in = nn.Parameter(torch.randn(f, cfg.n_keys, d) * 0.02)
        self.key_cond = nn.Parameter(torch.randn(f, cfg.n_keys, d) * 0.02)
        self.camera_in = nn.Linear(3, d)
        self.t_embed = nn.Sequential(nn.Linear(_T_FEATURES, d), nn.SiLU(), nn.Linear(d, d))
        self.mod = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.words = nn.Embedding(cfg.text_buckets, cfg.text_dim)
        self.blocks = nn.ModuleList(Block(d, cfg.n_heads, cfg.mlp_ratio, cfg.text_dim) for _ in range(cfg.n_layers))
        self.final_mod = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        half = cfg.frame_size // 2
        self.token_out = nn.Linear(d, (cfg.strip // 2) * half * cfg.token_features)
        # 3 + 1 + 3 + 3 image channels (shifted carry, its mask, carry, noisy frame), keys, camera
        self.local = LocalPath(cfg, 10 + cfg.n_keys + 3)
        # an untrained transformer adds nothing
        for lin in cast("tuple[nn.Linear, ...]", (self.mod[1], self.final_mod[1], self.token_out)):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def prompt_kv(self, word_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``word_ids int64[N, Tt]`` -> cross-attention k, v ``[n_layers, N, Tt, H, Dh]``."""
        w = self.words(word_ids)
        kv = [blk.prompt_kv(w) for blk in cast("list[Block]", self.blocks)]
        return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])

    def _inputs(self, x: torch.Tensor, carry: torch.Tensor, t: torch.Tensor,
                camera: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per frame ``[N, C, H, W]``: the noisy frame scaled by t, the carry, the shifted carry and its mask."""
        b, g, f, h, w, _ = x.shape
        xin = (x * t[:, :, None, None, None, None]).permute(0, 1, 2, 5, 3, 4).reshape(b * g * f, 3, h, w)
        cfr = carry.permute(0, 1, 4, 2, 3)[:, :, None].expand(b, g, f, 3, h, w).reshape(b * g * f, 3, h, w)
        turn = camera[..., 2:4].cumsum(2).reshape(b * g * f, 2) / DTHETA  # columns and rows since the carry
        base, mask = shift_frames(cfr, turn[:, 0], turn[:, 1])
        return xin, cfr, base, mask

    def forward(
        self,
        x: torch.Tensor,  # [B, G, F, H, W, 3] frames (clean groups) or noisy frames
        carry: torch.Tensor,  # [B, G, H, W, 3] the frame before each group
        t: torch.Tensor,  # [B, G] flow time of each group (1: clean)
        keys: torch.Tensor,  # int64 [B, G, F]
        camera: torch.Tensor,  # [B, G, F, 4] yaw, pitch, change of yaw and pitch since the frame before
        cos: torch.Tensor,  # [G*F*P, Dh] each token's full rotation (time and angle)
        sin: torch.Tensor,
        ctx_k: torch.Tensor | None,  # [L, B, Tc, H, Dh] rotated, or None
        ctx_v: torch.Tensor | None,
        attn_mask: torch.Tensor | None,  # bool [T, Tc + T] or None
        prompt_k: torch.Tensor,  # [L, B*G, Tt, H, Dh]
        prompt_v: torch.Tensor,
        prompt_mask: torch.Tensor | None,  # bool [B*G, Tt] or None
        want_output: bool = True,
        out_groups: int | None = None,  # predict only the last out_groups groups (default: all)
        local_only: bool = False,  # the local path alone (training's first stage): no blocks, no K/V
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        cfg = self.cfg
        b, g, f, h, w, _ = x.shape
        p, d, s = cfg.tokens_per_frame, cfg.d_model, cfg.strip // 2
        go = g if out_groups is None else out_groups
        xin, cfr, base, mask = self._inputs(x, carry, t, camera)
        slot = torch.arange(f).repeat(b * g).view(b, g, f)
        if local_only:
            hidden = xin.new_zeros((b * go * f, cfg.token_features, h // 2, w // 2))
            return self._output(xin, cfr, base, mask, keys, camera, hidden, b, g, go), None, None
        half = torch.cat([xin, base, mask], 1)
        half = F.avg_pool2d(half, 2)  # [N, 7, H/2, W/2]
        strips = half.view(b * g * f, 7, h // 2, p, s).permute(0, 3, 2, 4, 1).reshape(b, g, f, p, -1)
        emb = self.key_in[slot, keys].cumsum(2) + self.camera_in(camera_features(camera).to(x.dtype))
        hid = self.token_in(strips) + self.pos_strip + self.pos_frame[:, None, :] + emb[:, :, :, None, :]
        hid = hid.reshape(b, g * f * p, d)
        cond = self.t_embed(_t_features(t))[:, :, None, :] + self.key_cond[slot, keys].cumsum(2)
        mod = self.mod(cond).view(b, g * f, 1, 6, d)
        ks, vs = [], []
        for i, blk in enumerate(self.blocks):
            hid, k, v = blk(hid, mod, cos, sin, None if ctx_k is None else ctx_k[i],
                            None if ctx_v is None else ctx_v[i], attn_mask, prompt_k[i], prompt_v[i], prompt_mask)
            ks.append(k)
            vs.append(v)
        k_all, v_all = torch.stack(ks), torch.stack(vs)
        if not want_output:
            return None, k_all, v_all
        shift, scale = self.final_mod(cond[:, g - go :]).view(b, go * f, 1, 2, d).unbind(3)
        hid = hid.view(b, g * f, p, d)[:, (g - go) * f :]
        tok = self.token_out(F.layer_norm(hid, (d,)) * (1 + scale) + shift)  # [B, go*F, P, s*(H/2)*C]
        tok = tok.view(b * go * f, p, h // 2, s, cfg.token_features).permute(0, 4, 2, 1, 3)
        hidden = tok.reshape(b * go * f, cfg.token_features, h // 2, w // 2)
        return self._output(xin, cfr, base, mask, keys, camera, hidden, b, g, go), k_all, v_all

    def _output(self, xin: torch.Tensor, cfr: torch.Tensor, base: torch.Tensor, mask: torch.Tensor,
                keys: torch.Tensor, camera: torch.Tensor, hidden: torch.Tensor, b: int, g: int,
                go: int) -> torch.Tensor:
        """Frames ``[B, go, F, H, W, 3]`` of the last ``go`` groups through the local path."""
        cfg = self.cfg
        f, n = cfg.frames_per_chunk, cfg.n_keys
        h = w = cfg.frame_size

        def last(a: torch.Tensor) -> torch.Tensor:  # the frames of the last go groups (order b, g, f)
            return a.view(b, g * f, *a.shape[1:])[:, (g - go) * f :].reshape(-1, *a.shape[1:])

        xs, cs, bs, ms = last(xin), last(cfr), last(base), last(mask)
        onehot = F.one_hot(keys[:, g - go :], n).to(xs.dtype)  # [B, go, F, n]
        upto = torch.tril(torch.ones(f, f, dtype=xs.dtype))
        keyplanes = torch.einsum("fs,bgsn->bgfn", upto, onehot).reshape(-1, n)
        cam = camera_features(camera[:, g - go :]).reshape(-1, 3)
        planes = torch.cat([keyplanes, cam.to(xs.dtype)], 1)[:, :, None, None].expand(-1, -1, h, w)
        out = self.local(torch.cat([bs, ms, cs, xs, planes], 1), hidden)
        value, gate = out[:, :3], out[:, 3:]
        x1 = bs + torch.sigmoid(gate) * (value - bs)
        return x1.permute(0, 2, 3, 1).reshape(b, go, f, h, w, 3)
