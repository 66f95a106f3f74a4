"""The view of the state model: what the walker sees from a pose, from a learnt map of the maze.

The map is two learnt grids over the floor plan (``[0, extent]^2``, bilinear): a *density*
(``occupancy_per_cell`` points a cell; where a ray stops) and an *appearance* (``appearance_channels``
features, ``appearance_per_cell`` points a cell; what it shows there). A frame is drawn the way a
raycaster draws one, with both learnt:

- each column casts a ray at its world angle (the cylindrical camera of ``maze/raycast.py``:
  column ``c`` looks along ``yaw + (c + 0.5 - W/2) * DTHETA``) and marches ``ray_samples`` points
  up to ``ray_far`` through the density (volume rendering, as NeRF does in 3-D): the column's
  expected depth, and the appearance features where the ray stops (the plan at that depth);
- each pixel is a small MLP of its column's features and depth, the colour of the column's
  surface at the pixel's height (the map's third grid: ``surface_bins`` colours from a wall's foot
  to its top at each point of the plan, a learnt texture of the maze), the theme (a learnt embedding),
  and where the pixel is relative to the horizon (the pinhole rows of the camera: ``o`` rows below
  the horizon see height ``o * depth / FOCAL`` on a wall at ``depth``, with sines of it at a few
  frequencies (NeRF's positional encoding: sharp edges), the floor at ``FOCAL / (2 o)``); pitch
  moves the horizon, as in the raycaster.

Everything the frame holds comes from the pose and the theme: a place looks the same however the
walker came there (a revisit is exact), and there is nothing to drift but the pose.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from execstate.model.world.maze.pose import DTHETA
from execstate.model.world.maze.state.config import StateModelConfig

FOCAL = 1.0 / DTHETA
DENSITY_SCALE = 20.0  # density per cell = softplus(grid) * this
_HEIGHT_FREQUENCIES = (1.0, 2.0, 4.0, 8.0)  # sines and cosines of the height on the wall (sharp edges)
_GEOMETRY_FEATURES = 6 + 2 * len(_HEIGHT_FREQUENCIES)


def plan_coords(px: torch.Tensor, pz: torch.Tensor, extent: float) -> torch.Tensor:
    """Floor-plan positions -> ``grid_sample`` coordinates (x indexes the grid's columns)."""
    return torch.stack([px, pz], dim=-1) * (2.0 / extent) - 1.0


def sample_plan(grid: torch.Tensor, px: torch.Tensor, pz: torch.Tensor, extent: float) -> torch.Tensor:
    """``grid [1, C, G, G]`` at floor-plan points ``px, pz [N, K]`` -> ``[C, N, K]``."""
    g = plan_coords(px, pz, extent)[None]
    return F.grid_sample(grid, g, mode="bilinear", padding_mode="border", align_corners=True)[0]


class ViewField(nn.Module):
    def __init__(self, cfg: StateModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_d, n_a = cfg.grid_points(cfg.occupancy_per_cell), cfg.grid_points(cfg.appearance_per_cell)
        self.density = nn.Parameter(torch.full((1, 1, n_d, n_d), -3.0))
        self.appearance = nn.Parameter(0.1 * torch.randn(1, cfg.appearance_channels, n_a, n_a))
        self.surface = nn.Parameter(torch.zeros(1, 3 * cfg.surface_bins, n_a, n_a))
        self.theme = nn.Embedding(len(cfg.themes), cfg.theme_dim)
        h = cfg.mlp_hidden
        width = cfg.appearance_channels + cfg.theme_dim + _GEOMETRY_FEATURES + 3
        self.mlp = nn.Sequential(nn.Linear(width, h), nn.SiLU(),
                                 nn.Linear(h, h), nn.SiLU(), nn.Linear(h, 3))
        self.register_buffer("t", (torch.arange(cfg.ray_samples) + 0.5) * (cfg.ray_far / cfg.ray_samples),
                             persistent=False)

    def cast(self, x: torch.Tensor, z: torch.Tensor, angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rays from ``x, z [N]`` along ``angles [N, W]`` -> expected depth ``[N, W]`` (``ray_far``
        where nothing stops the ray) and features ``[N, W, C + 3 * surface_bins]`` (the appearance,
        then the surface's colours from its foot to its top)."""
        cfg = self.cfg
        n, w = angles.shape
        t = cast(torch.Tensor, self.t)
        dt = cfg.ray_far / cfg.ray_samples
        px = x[:, None, None] + t * torch.cos(angles)[..., None]
        pz = z[:, None, None] + t * torch.sin(angles)[..., None]
        px, pz = px.reshape(n * w, -1), pz.reshape(n * w, -1)
        tau = F.softplus(sample_plan(self.density, px, pz, cfg.extent)[0]) * (DENSITY_SCALE * dt)
        through = torch.cumsum(tau, dim=-1)
        weight = torch.exp(tau - through) * (1.0 - torch.exp(-tau))  # reaches the sample, stops in it
        rest = torch.exp(-through[:, -1])
        depth = (weight * t).sum(-1) + rest * cfg.ray_far
        depth = depth.view(n, w)
        hx = x[:, None] + depth * torch.cos(angles)
        hz = z[:, None] + depth * torch.sin(angles)
        feats = sample_plan(torch.cat([self.appearance, self.surface], dim=1), hx, hz, cfg.extent)
        return depth, feats.permute(1, 2, 0)

    def shade(self, depth: torch.Tensor, feats: torch.Tensor, rows: torch.Tensor, theme: torch.Tensor) -> torch.Tensor:
        """Pixels ``[N, R, W, 3]`` (RGB in about ``[-1, 1]``) of columns with ``depth [N, W]`` and
        ``feats [N, W, C]`` at row offsets from the horizon ``rows [N, R]`` (> 0: below it), theme
        ids ``[N]``."""
        cfg = self.cfg
        n, w = depth.shape
        r = rows.shape[1]
        o = rows[:, :, None]
        d = depth[:, None, :]
        height = (o * d / FOCAL).clamp(-3.0, 3.0)  # on a wall at depth d: -0.5 .. 0.5 is the wall
        plane = (0.5 * FOCAL / o.abs().clamp_min(0.5)).clamp(max=cfg.ray_far) / cfg.ray_far  # the floor / ceiling
        waves = [f(math.pi * k * height) for k in _HEIGHT_FREQUENCIES for f in (torch.sin, torch.cos)]
        geo = torch.stack(torch.broadcast_tensors(height, o / (cfg.frame_size / 2), plane, torch.sign(o),
                                                  d / cfg.ray_far, 1.0 / (1.0 + d), *waves), dim=-1)
        emb = self.theme(theme)[:, None, None, :].expand(n, r, w, -1)
        c, bins = cfg.appearance_channels, cfg.surface_bins
        surface = feats[..., c:].reshape(n, w, bins, 3)
        at = ((height.clamp(-0.5, 0.5) + 0.5) * bins - 0.5).clamp(0, bins - 1)[..., None]  # [N, R, W, 1]
        tent = (1.0 - (at - torch.arange(bins, dtype=torch.float32)).abs()).clamp_min(0.0)
        colour = torch.einsum("nrwb,nwbc->nrwc", tent, surface)
        x = torch.cat([feats[..., :c][:, None].expand(n, r, w, -1), emb, geo, colour], dim=-1)
        out: torch.Tensor = self.mlp(x)
        return out

    def columns(self, x: torch.Tensor, z: torch.Tensor, angles: torch.Tensor, pitch: torch.Tensor,
                theme: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The columns at ``angles [N, W]`` of the views from ``x, z, pitch [N]`` -> pixels
        ``[N, H, W, 3]`` and depths ``[N, W]``."""
        depth, feats = self.cast(x, z, angles)
        size = self.cfg.frame_size
        rows = torch.arange(size, dtype=torch.float32) + 0.5 - size / 2
        rows = rows[None, :] - (pitch / DTHETA)[:, None]
        return self.shade(depth, feats, rows, theme), depth

    def frames(self, x: torch.Tensor, z: torch.Tensor, yaw: torch.Tensor, pitch: torch.Tensor,
               theme: torch.Tensor) -> torch.Tensor:
        """The views ``[N, H, W, 3]`` from poses ``x, z, yaw, pitch [N]`` (yaw in the maze's frame)."""
        size = self.cfg.frame_size
        offsets = (torch.arange(size, dtype=torch.float32) + 0.5 - size / 2) * DTHETA
        return self.columns(x, z, yaw[:, None] + offsets[None, :], pitch, theme)[0]
