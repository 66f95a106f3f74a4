"""Shapes and hyper-parameters of the maze state model (``network.py``): one frozen dataclass,
stored as JSON next to the weights.

The model knows one maze (``maze_seed``: the procedural maze it was trained on) in its weights;
``home_*`` is that maze's start pose, where a session that starts from nothing starts (recorded
from the renderer when the model was trained, like any other learnt constant)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from execstate.model.world.maze.pose import KEYS
from execstate.model.world.maze.raycast import SIZE
from execstate.model.world.maze.textures import THEME_NAMES


@dataclass(frozen=True)
class StateModelConfig:
    maze_seed: int = 3
    home_x: float = 1.5
    home_z: float = 1.5
    home_yaw: float = 0.0
    extent: float = 15.0  # the map's side in cells: the learnt grids cover [0, extent]^2
    frame_size: int = SIZE
    frames_per_chunk: int = 2
    n_keys: int = len(KEYS)
    themes: tuple[str, ...] = THEME_NAMES
    # the view (view.py)
    occupancy_per_cell: int = 16 # density grid points per cell
    appearance_per_cell: int = 16  # appearance grid points per cell
    appearance_channels: int = 16
    surface_bins: int = 16  # colours up a wall, per point of the plan
    ray_samples: int = 256
    ray_far: float = 10.24  # cells a ray marches; beyond it, fog
    theme_dim: int = 8
    mlp_hidden: int = 96
    # the motion (motion.py)
    free_per_cell: int = 16  # free-space (clearance) grid points per cell
    token_dim: int = 16  # the state token's key and value (one head, one layer): the K/V per frame
    sink_chunks: int = 1
    window_chunks: int = 16

    def __post_init__(self) -> None:
        for name in ("occupancy_per_cell", "appearance_per_cell", "appearance_channels", "surface_bins", "ray_samples",
                     "theme_dim", "mlp_hidden", "free_per_cell", "token_dim", "frames_per_chunk", "sink_chunks",
                     "window_chunks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.extent <= 0 or self.ray_far <= 0:
            raise ValueError("extent and ray_far must be positive")
        if not self.themes:
            raise ValueError("themes must not be empty")

    def grid_points(self, per_cell: int) -> int:
        return round(self.extent * per_cell) + 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StateModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown maze state model config fields: {sorted(unknown)}")
        data = dict(data)
        if "themes" in data:
            data["themes"] = tuple(data["themes"])
        return cls(**data)
