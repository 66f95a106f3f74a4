"""The motion of the state model: where the walker is after a frame's key, learnt.

The state is the walker's position ``(x, z)`` on the plan (the yaw is the session's camera, which
nothing blocks). A frame's key moves it by a learnt step (``steps``: forward and sideways cells a
frame per key, turned by the frame's world yaw), taken along x, then along z, each only where a
learnt *free-space map* (``free``: a value per point of the plan, ``free_per_cell`` points a cell,
bilinear; > 0: the walker may stand there) lets it: so it slides along a wall it walks into and
stops at one ahead, wherever the map says the walls are. The map is trained to be the walker's
*clearance* (the distance from its disc to the nearest wall or object, in cells; it starts at -2,
blocked everywhere): near a wall that distance is linear in the position, which the bilinear grid
holds almost exactly (to about 0.002 cell), so the gates flip where the walker's disc meets the
wall. The gates are hard (a blocked step is not taken at all), with one rule beside the map's
verdict (:func:`slide_gate`): a step that lowers the clearance by less than half its length and
ends at most 0.01 cell inside the band runs along a wall, not into it, and is taken (a walker the
map's small errors would otherwise stop on a wall it touches, or hold a hair inside the band, got
stuck there for good while the true walker slid on); into a wall the clearance falls by the whole
step, so no wall is walked into. Training
can run chunks of walks through the gates with a sigmoid's gradient (straight-through).

The state tokens: each frame's state (its position, yaw, key and gates) becomes one token whose key
and value (``token_dim``, one head) are the session's K/V, so the session's cache holds the
walker's path in the window (rolled, checkpointed, hibernated with the session). The motion itself
is Markov in the state and reads none of it: an attention correction of the gates from the
context's tokens was tried and learnt to open gates into walls (docs/world-maze.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from execstate.model.world.maze.state.config import StateModelConfig
from execstate.model.world.maze.state.view import sample_plan

SLIDE = 0.5  # a step whose clearance falls by less than this part of its length slides (slide_gate) ...
SLIDE_DEPTH = 0.01  # ... if it ends at most this far (cells) inside the band: a few times the map's error


def _features(cfg: StateModelConfig, x: torch.Tensor, z: torch.Tensor, yaw: torch.Tensor, key: torch.Tensor,
              gates: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.stack([x / cfg.extent, z / cfg.extent, torch.cos(yaw), torch.sin(yaw)], dim=-1),
                      F.one_hot(key, cfg.n_keys).to(torch.float32), gates], dim=-1)


def slide_gate(there: torch.Tensor, here: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """A step's gate value (> 0: taken) from the map's value ``there`` (after it) and ``here`` (before
    it) and the step along its axis: the map's verdict, or open for a step that ends at most
    ``SLIDE_DEPTH`` inside the band and lowers the value by less than ``SLIDE`` of its length.
    Such a step runs along a wall, not into it (into a wall the clearance falls by the whole step);
    without the rule a map a few thousandths of a cell off stops a walker sliding along a wall it
    touches, or holds one it let a hair inside the band, for good."""
    return torch.maximum(there, torch.minimum(there + SLIDE_DEPTH, there - here + SLIDE * step.abs()))


class Motion(nn.Module):
    def __init__(self, cfg: StateModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n = cfg.grid_points(cfg.free_per_cell)
        self.free = nn.Parameter(torch.full((1, 1, n, n), -2.0))  # blocked until training says free
        self.steps = nn.Parameter(torch.zeros(cfg.n_keys, 2))
        self.kv = nn.Linear(4 + cfg.n_keys + 2, 2 * cfg.token_dim)

    def free_logit(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The map's value (the learnt clearance, cells; > 0: free) at ``x, z [N]``."""
        return sample_plan(self.free, x[:, None], z[:, None], self.cfg.extent)[0, :, 0]

    def displacement(self, yaw: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys' learnt steps turned by the yaws (any matching shapes) -> ``dx, dz``."""
        step = self.steps[key]
        c, s = torch.cos(yaw), torch.sin(yaw)
        return step[..., 0] * c - step[..., 1] * s, step[..., 0] * s + step[..., 1] * c

    def walk(self, x: torch.Tensor, z: torch.Tensor, yaw: torch.Tensor, key: torch.Tensor,
             hard: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames ``yaw, key [N, F]`` from ``x, z [N]`` ->
        positions ``[N, F, 2]`` after each frame and gate values ``[N, F, 2]`` (x, then z;
        :func:`slide_gate`). The gates are hard (value > 0) either way; ``hard=False`` (training)
        passes the sigmoid's gradient through them (straight-through) and none to the steps, so
        training unrolls exactly what inference runs."""
        def gate(logit: torch.Tensor) -> torch.Tensor:
            h = (logit > 0).to(torch.float32)
            if hard:
                return h
            soft = torch.sigmoid(logit)
            return h + (soft - soft.detach())

        xs, logits = [], []
        here = self.free_logit(x, z)
        for f in range(key.shape[1]):
            dx, dz = self.displacement(yaw[:, f], key[:, f])
            if not hard:
                dx, dz = dx.detach(), dz.detach()
            lx = self.free_logit(x + dx, z)
            gx = slide_gate(lx, here, dx)
            x = x + dx * gate(gx)
            here = torch.where(gx > 0, lx, here)
            lz = self.free_logit(x, z + dz)
            gz = slide_gate(lz, here, dz)
            z = z + dz * gate(gz)
            here = torch.where(gz > 0, lz, here)
            xs.append(torch.stack([x, z], dim=-1))
            logits.append(torch.stack([gx, gz], dim=-1))
        return torch.stack(xs, dim=1), torch.stack(logits, dim=1)

    def tokens(self, xz: torch.Tensor, yaw: torch.Tensor, key: torch.Tensor,
               logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The frames' state tokens: keys and values ``[N, F, token_dim]``."""
        kv = self.kv(_features(self.cfg, xz[..., 0], xz[..., 1], yaw, key, torch.sigmoid(logits)))
        return kv[..., : self.cfg.token_dim], kv[..., self.cfg.token_dim :]
