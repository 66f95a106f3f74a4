"""Where a frame was seen from: how the state model starts a session from a frame.

:func:`locate` searches around the home pose (the maze's start: where every scene of the maze the
model knows starts) for the pose whose view (``view.py``, the model's own map) matches the frame
best: rounds of a 3 x 3 x 3 grid of position and yaw offsets, halving the offsets each round, from
``REFINE_START`` (so it reaches about twice that from home), scored on every other row and column.
Deterministic: the same frame gives the same pose. A frame seen from farther away is located where
the view near home matches it best, which is not where it was seen (a limitation: a global search
over the map costs seconds; a learnt locator did not learn in the budget, docs/world-maze.md).
"""

from __future__ import annotations

import torch

from execstate.model.world.maze.pose import DTHETA
from execstate.model.world.maze.state.view import ViewField

REFINE_ROUNDS = 5
REFINE_START = (0.2, 4 * DTHETA)  # the first round's position and yaw offsets (cells, radians)


def locate(view: ViewField, frame: torch.Tensor, theme: int, pitch: float,
           home: tuple[float, float, float]) -> tuple[float, float, float]:
    """The pose ``(x, z, yaw)`` near ``home`` a frame ``[H, W, 3]`` was seen from (module docstring)."""
    x, z, yaw, _ = refine(view, frame, theme, pitch, *home)
    return x, z, yaw


def refine(view: ViewField, frame: torch.Tensor, theme: int, pitch: float, x: float, z: float,
           yaw: float) -> tuple[float, float, float, float]:
    """The pose near ``(x, z, yaw)`` whose view matches ``frame [H, W, 3]`` best (module docstring),
    and its mean squared error on the scored pixels."""
    size = view.cfg.frame_size
    target = frame[::2, ::2]
    cols = (torch.arange(0, size, 2, dtype=torch.float32) + 0.5 - size / 2) * DTHETA
    rows = (torch.arange(0, size, 2, dtype=torch.float32) + 0.5 - size / 2) - pitch / DTHETA
    grid = torch.tensor([-1.0, 0.0, 1.0])
    dp, dy = REFINE_START
    for _ in range(REFINE_ROUNDS):
        ox, oz, oy = torch.meshgrid(grid * dp, grid * dp, grid * dy, indexing="ij")
        cx, cz, cy = x + ox.reshape(-1), z + oz.reshape(-1), yaw + oy.reshape(-1)
        n = cx.shape[0]
        depth, feats = view.cast(cx, cz, cy[:, None] + cols[None, :])
        pix = view.shade(depth, feats, rows[None, :].expand(n, -1), torch.full((n,), theme, dtype=torch.long))
        err = ((pix - target) ** 2).mean(dim=(1, 2, 3))
        best = int(err.argmin())
        x, z, yaw, score = float(cx[best]), float(cz[best]), float(cy[best]), float(err[best])
        dp, dy = dp / 2, dy / 2
    return x, z, yaw, score
