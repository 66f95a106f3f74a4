"""Shapes and hyper-parameters of the world model (one frozen dataclass, stored as JSON next to the
weights). Derived sizes are properties, so a config file holds only free choices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from execstate.model.world.palette_codec import K as PALETTE_SIZE

CODECS = ("patch", "palette")


@dataclass(frozen=True)
class WorldModelConfig:
    frame_size: int = 48  # frames are frame_size x frame_size RGB
    patch_size: int = 12  # latent token = one patch_size x patch_size x 3 patch (3 x 3 world cells)
    frames_per_chunk: int = 2  # F: frames generated per step
    carry_frames: int = 2  # frames before the chunk given to every token (channel concat)
    d_model: int = 192
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    n_actions: int = 5  # discrete keys (renderer.ACTIONS)
    camera_dim: int = 0  # continuous camera deltas per frame (0: the world has no camera)
    text_buckets: int = 256  # hashed prompt-word vocabulary (bucket 0: the always-present null word)
    text_dim: int = 64
    max_prompt_words: int = 8
    sink_chunks: int = 1  # chunks kept at the start of the context (the attention sink)
    window_chunks: int = 3  # most recent chunks kept besides the sink (the trained maximum)
    action_shift_px: int = 0  # > 0: also input the carry shifted by the keys' moves (shift.py), px per cell
    schedule: tuple[float, ...] = (0.0, 0.5)  # flow times the few-step sampler visits (0: noise, 1: clean)
    codec: str = "patch"  # latent_codec.py: "patch" (pixel patches, MSE) or "palette" (one-hot cells, cross-entropy)
    cell_size: int = 4  # "palette": pixels per world cell (a latent unit)
    conv_channels: int = 0  # > 0: 3x3 convolutions over the unit grid before and after the transformer (cell_conv.py)
    conv_layers: int = 2  # convolutions in the stem (>= 2; the third on are residual)
    conv_keys: bool = False  # the stem also gets the frame's keys (one-hot per frame slot) as constant channels
    conv_prev_frame: bool = False  # frame f's stem also gets frame f-1's noisy input

    def __post_init__(self) -> None:
        if self.frame_size % self.patch_size:
            raise ValueError(f"frame_size {self.frame_size} is not a multiple of patch_size {self.patch_size}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model {self.d_model} / n_heads {self.n_heads} must be an even head size")
        if not self.schedule or any(not 0.0 <= t < 1.0 for t in self.schedule) or list(self.schedule) != sorted(
                set(self.schedule)):
            raise ValueError(f"schedule must be increasing flow times in [0, 1), got {self.schedule}")
        if self.codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, got {self.codec!r}")
        if self.codec == "palette" and (self.cell_size < 1 or self.patch_size % self.cell_size):
            raise ValueError(f"patch_size {self.patch_size} is not a multiple of cell_size {self.cell_size}")
        if self.conv_channels < 0 or (self.conv_channels and self.codec != "palette"):
            raise ValueError(f"conv_channels must be 0, or > 0 with the palette codec; got {self.conv_channels} "
                             f"with codec {self.codec!r}")
        if self.conv_layers < 2:
            raise ValueError(f"conv_layers must be >= 2, got {self.conv_layers}")
        if (self.conv_keys or self.conv_prev_frame or self.conv_layers != 2) and not self.conv_channels:
            raise ValueError("conv_layers, conv_keys and conv_prev_frame need conv_channels > 0")
        for name in ("frames_per_chunk", "carry_frames", "n_layers", "sink_chunks", "window_chunks",
                     "max_prompt_words"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def tokens_per_frame(self) -> int:
        return (self.frame_size // self.patch_size) ** 2

    @property
    def tokens_per_chunk(self) -> int:
        return self.tokens_per_frame * self.frames_per_chunk

    @property
    def patch_dim(self) -> int:
        return self.patch_size * self.patch_size * 3

    @property
    def latent_grid(self) -> int:
        """Latent units (pixels, or palette cells) per token side."""
        return self.patch_size // self.cell_size if self.codec == "palette" else self.patch_size

    @property
    def latent_channels(self) -> int:
        return PALETTE_SIZE if self.codec == "palette" else 3

    @property
    def latent_dim(self) -> int:
        """Values per latent token."""
        return self.latent_grid * self.latent_grid * self.latent_channels

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorldModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown world model config fields: {sorted(unknown)}")
        data = dict(data)
        if "schedule" in data:
            data["schedule"] = tuple(float(t) for t in data["schedule"])
        return cls(**data)
