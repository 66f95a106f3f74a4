"""The motion of the state model: where the walker is after a frame's key, learnt.

The state is the walker's position ``(x, z)`` on the plan (the yaw is the session's camera, which
nothing blocks). A frame's key moves it by a learnt step (``steps``: forward and sideways cells a
frame per key, turned by the frame's world yaw), taken along x, then along z, each only where a
learnt *free-space map* (``free``: a logit per point of the plan, ``free_per_cell`` points a cell,
bilinear; > 0: the walker may stand there; it starts blocked everywhere, so what training never
saw free stays a wall) lets it: so it slides along a wall it walks into and stops at one ahead,
wherever the map says the walls are. The gates are hard (logit > 0: a blocked step is not taken at
all); training runs chunks of walks through them with a sigmoid's gradient (straight-through).

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


def _features(cfg: StateModelConfig, x: torch.Tensor, z: torch.Tensor, yaw: torch.Tensor, key: torch.Tensor,
              gates: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.stack([x / cfg.extent, z / cfg.extent, torch.cos(yaw), torch.sin(yaw)], dim=-1),
                      F.one_hot(key, cfg.n_keys).to(torch.float32), gates], dim=-1)


class Motion(nn.Module):
    def __init__(self, cfg: StateModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n = cfg.grid_points(cfg.free_per_cell)
        self.free = nn.Parameter(torch.full((1, 1, n, n), -2.0))  # blocked until training says free
        self.steps = nn.Parameter(torch.zeros(cfg.n_keys, 2))
        self.kv = nn.Linear(4 + cfg.n_keys + 2, 2 * cfg.token_dim)

    def free_logit(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return sample_plan(self.free, x[:, None], z[:, None], self.cfg.extent)[0, :, 0]

    def displacement(self, yaw: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys' learnt steps turned by the yaws (any matching shapes) -> ``dx, dz``."""
        step = self.steps[key]
        c, s = torch.cos(yaw), torch.sin(yaw)
        return step[..., 0] * c - step[..., 1] * s, step[..., 0] * s + step[..., 1] * c

    def walk(self, x: torch.Tensor, z: torch.Tensor, yaw: torch.Tensor, key: torch.Tensor,
             hard: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames ``yaw, key [N, F]`` from ``x, z [N]`` ->
        positions ``[N, F, 2]`` after each frame and gate logits ``[N, F, 2]`` (x, then z). The gates
        are hard (logit > 0) either way; ``hard=False`` (training) passes the sigmoid's gradient
        through them (straight-through) and none to the steps, so training unrolls exactly what
        inference runs and the unrolled error trains the map."""
        def gate(logit: torch.Tensor) -> torch.Tensor:
            h = (logit > 0).to(torch.float32)
            if hard:
                return h
            soft = torch.sigmoid(logit)
            return h + (soft - soft.detach())

        xs, logits = [], []
        for f in range(key.shape[1]):
            dx, dz = self.displacement(yaw[:, f], key[:, f])
            if not hard:
                dx, dz = dx.detach(), dz.detach()
            lx = self.free_logit(x + dx, z)
            x = x + dx * gate(lx)
            lz = self.free_logit(x, z + dz)
            z = z + dz * gate(lz)
            xs.append(torch.stack([x, z], dim=-1))
            logits.append(torch.stack([lx, lz], dim=-1))
        return torch.stack(xs, dim=1), torch.stack(logits, dim=1)

    def tokens(self, xz: torch.Tensor, yaw: torch.Tensor, key: torch.Tensor,
               logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The frames' state tokens: keys and values ``[N, F, token_dim]``."""
        kv = self.kv(_features(self.cfg, xz[..., 0], xz[..., 1], yaw, key, torch.sigmoid(logits)))
        return kv[..., : self.cfg.token_dim], kv[..., self.cfg.token_dim :]
