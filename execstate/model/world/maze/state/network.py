"""The maze state model's network: the view (``view.py``) and the motion (``motion.py``) of one
maze, and one chunk's step (:meth:`StateNet.chunk`: the motion and the state tokens,
:meth:`StateNet.state_step`, then the view from each frame's pose) as the model's denoise and
commit run it.

The state carried from chunk to chunk is ``float32[4]``: the position ``x, z`` on the plan, the
maze's yaw at the session's yaw 0 (the session integrates its camera from there), and whether the
session has been located yet (1.0) or not (0.0: the first chunk locates it).
"""

from __future__ import annotations

import torch
from torch import nn

from execstate.model.world.maze.state.config import StateModelConfig
from execstate.model.world.maze.state.motion import Motion
from execstate.model.world.maze.state.view import ViewField


class StateNet(nn.Module):
    def __init__(self, cfg: StateModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.view = ViewField(cfg)
        self.motion = Motion(cfg)

    def state_step(self, state: torch.Tensor, keys: torch.Tensor, camera: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The motion of one chunk from a located ``state [4]``: ``keys [F]``, ``camera [F, 4]``
        (session yaw and pitch first) -> the positions ``[F, 2]``, the frames' maze yaws ``[F]`` and
        their state tokens' keys and values ``[F, token_dim]``."""
        x, z = state[0:1], state[1:2]
        yaw = (state[2] + camera[:, 0])[None]
        k = keys[None]
        xz, gates = self.motion.walk(x, z, yaw, k, hard=True)
        tk, tv = self.motion.tokens(xz, yaw, k, gates)
        return xz[0], yaw[0], tk[0], tv[0]

    def chunk(self, state: torch.Tensor, keys: torch.Tensor, camera: torch.Tensor, theme: torch.Tensor,
              render: bool) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One chunk from a located ``state [4]``: ``keys [F]``, ``camera [F, 4]`` (session yaw and
        pitch first), theme id ``[1]`` -> the frames ``[F, H, W, 3]`` (if ``render``), the positions
        ``[F, 2]`` and the frames' state tokens' keys and values ``[F, token_dim]``."""
        xz, yaw, tk, tv = self.state_step(state, keys, camera)
        frames = None
        if render:
            frames = self.view.frames(xz[:, 0], xz[:, 1], yaw, camera[:, 1], theme.expand(keys.shape[0]))
        return frames, xz, tk, tv
