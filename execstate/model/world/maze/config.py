"""Shapes and hyper-parameters of the maze world model (one frozen dataclass, stored as JSON next to
the weights). Derived sizes are properties, so a config file holds only free choices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from execstate.model.world.maze.pose import KEYS
from execstate.model.world.maze.raycast import SIZE


@dataclass(frozen=True)
class MazeModelConfig:
    frame_size: int = SIZE  # frames are frame_size x frame_size RGB (the raycaster's)
    strip: int = 4  # a token is a vertical strip of this many columns (16 per 64-pixel frame)
    frames_per_chunk: int = 2
    d_model: int = 192
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    time_pairs: int = 4  # rotary pairs of each head that encode time (the rest: the world angle)
    n_keys: int = len(KEYS)
    text_buckets: int = 256
    text_dim: int = 64
    max_prompt_words: int = 8
    sink_chunks: int = 1
    window_chunks: int = 16
    schedule: tuple[float, ...] = (0.0,)
    conv_channels: tuple[int, int] = (16, 32)  # the local path: full-resolution and half-resolution channels
    token_features: int = 8  # channels the transformer adds to the local path at half resolution

    def __post_init__(self) -> None:
        if self.frame_size % (2 * self.strip):
            raise ValueError(f"frame_size {self.frame_size} is not a multiple of 2 * strip ({2 * self.strip})")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model {self.d_model} / n_heads {self.n_heads} must be an even head size")
        if not 1 <= self.time_pairs < self.head_dim // 2:
            raise ValueError(f"time_pairs must be in [1, {self.head_dim // 2}), got {self.time_pairs}")
        if not self.schedule or any(not 0.0 <= t < 1.0 for t in self.schedule) or list(self.schedule) != sorted(
                set(self.schedule)):
            raise ValueError(f"schedule must be increasing flow times in [0, 1), got {self.schedule}")
        for name in ("frames_per_chunk", "n_layers", "sink_chunks", "window_chunks", "max_prompt_words",
                     "token_features"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if len(self.conv_channels) != 2 or min(self.conv_channels) < 1:
            raise ValueError(f"conv_channels must be two positive ints, got {self.conv_channels}")

    @property
    def tokens_per_frame(self) -> int:
        return self.frame_size // self.strip

    @property
    def tokens_per_chunk(self) -> int:
        return self.tokens_per_frame * self.frames_per_chunk

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def token_in(self) -> int:
        """Values per token at half resolution: (strip / 2) columns x (frame / 2) rows x 7 channels
        (the noisy frame, the shifted carry and its mask)."""
        return (self.strip // 2) * (self.frame_size // 2) * 7

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MazeModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown maze model config fields: {sorted(unknown)}")
        data = dict(data)
        for name in ("schedule", "conv_channels"):
            if name in data:
                data[name] = tuple(data[name])
        return cls(**data)
