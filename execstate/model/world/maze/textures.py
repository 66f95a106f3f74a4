"""Wall textures, object sprites and themes of the maze world (procedural, fixed: no seed).

- :data:`WALL_TEXTURES` ``float32[len(WALL_KINDS), TEX, TEX, 3]`` in ``[0, 1]``: brick (red
  courses and mortar), stone (grey blocks), wood (vertical planks), tile (teal squares). The
  patterns are made once from a fixed generator, so every process draws the same world.
- :data:`SPRITES` ``float32[len(OBJECT_KINDS), TEX, TEX, 4]``: RGB and alpha of each object
  (barrel, plant, lamp), drawn as a billboard standing on the floor.
- :data:`THEMES`: the light of the maze, chosen by a word of the prompt (:func:`theme_for_prompt`):
  floor, ceiling and fog colours and a tint multiplied into the walls and objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from execstate.model.world.maze.layout import OBJECT_KINDS, WALL_KINDS

TEX = 16


@dataclass(frozen=True)
class Theme:
    floor: tuple[float, float, float]
    ceiling: tuple[float, float, float]
    fog: tuple[float, float, float]
    tint: tuple[float, float, float]
    fog_distance: float  # cells over which the light falls to 1/e


THEMES: dict[str, Theme] = {
    "dungeon": Theme((0.36, 0.30, 0.24), (0.22, 0.22, 0.25), (0.06, 0.05, 0.05), (1.0, 0.95, 0.85), 6.0),
    "ice": Theme((0.70, 0.78, 0.85), (0.55, 0.65, 0.80), (0.80, 0.86, 0.95), (0.85, 0.95, 1.15), 7.0),
    "jungle": Theme((0.25, 0.38, 0.16), (0.30, 0.45, 0.35), (0.10, 0.20, 0.10), (0.9, 1.1, 0.8), 5.5),
}
THEME_NAMES = tuple(THEMES)
DEFAULT_THEME = "dungeon"


def theme_for_prompt(prompt: str) -> str:
    """The first theme name among the prompt's words (case-insensitive), else the default."""
    for word in prompt.lower().replace(",", " ").replace(".", " ").split():
        if word in THEMES:
            return word
    return DEFAULT_THEME


def _brick(rng: np.random.Generator) -> np.ndarray:
    t = np.empty((TEX, TEX, 3), np.float32)
    t[:] = (0.62, 0.26, 0.18)
    t *= 0.9 + 0.2 * rng.random((TEX, TEX, 1))
    for row in range(0, TEX, 4):
        t[row] = (0.52, 0.44, 0.38)  # mortar between courses
        off = 0 if (row // 4) % 2 == 0 else 4
        for col in range(off, TEX, 8):
            t[row : row + 4, col] = (0.52, 0.44, 0.38)
    return t


def _stone(rng: np.random.Generator) -> np.ndarray:
    t = np.empty((TEX, TEX, 3), np.float32)
    for by in range(0, TEX, 8):
        for bx in range(0, TEX, 8):
            t[by : by + 8, bx : bx + 8] = 0.45 + 0.15 * rng.random()
    t *= 0.92 + 0.16 * rng.random((TEX, TEX, 1))
    t[::8, :] = 0.25
    t[:, ::8] = 0.25
    return t * np.array([1.0, 1.0, 1.05], np.float32)


def _wood(rng: np.random.Generator) -> np.ndarray:
    t = np.empty((TEX, TEX, 3), np.float32)
    for col in range(0, TEX, 4):
        t[:, col : col + 4] = np.array([0.55, 0.37, 0.2]) * (0.85 + 0.3 * rng.random())
    grain = 0.9 + 0.1 * np.sin(np.arange(TEX)[:, None] * 1.3 + rng.random((1, TEX)) * 6)
    t *= grain[..., None].astype(np.float32)
    t[:, ::4] *= 0.6
    return t


def _tile(rng: np.random.Generator) -> np.ndarray:
    t = np.empty((TEX, TEX, 3), np.float32)
    t[:] = (0.2, 0.58, 0.58)
    t *= 0.93 + 0.14 * rng.random((TEX, TEX, 1))
    t[::4, :] = (0.45, 0.66, 0.62)
    t[:, ::4] = (0.45, 0.66, 0.62)
    return t


def _sprites() -> np.ndarray:
    s = np.zeros((len(OBJECT_KINDS), TEX, TEX, 4), np.float32)
    yy, xx = np.mgrid[0:TEX, 0:TEX] + 0.5
    c = TEX / 2
    barrel = (np.abs(xx - c) < 5.5) & (yy > 3)
    s[0][barrel] = (0.55, 0.33, 0.12, 1.0)
    s[0][barrel & ((yy.astype(int) % 5) == 0)] = (0.3, 0.3, 0.32, 1.0)  # hoops
    pot = (np.abs(xx - c) < 3.5) & (yy > 11)
    leaves = ((xx - c) ** 2 / 36 + (yy - 6) ** 2 / 25) < 1
    s[1][leaves] = (0.2, 0.65, 0.2, 1.0)
    s[1][pot] = (0.7, 0.4, 0.25, 1.0)
    pole = (np.abs(xx - c) < 1) & (yy > 5)
    bulb = ((xx - c) ** 2 + (yy - 4) ** 2) < 9
    s[2][pole] = (0.25, 0.25, 0.28, 1.0)
    s[2][bulb] = (1.0, 0.92, 0.5, 1.0)
    return s


def _walls() -> np.ndarray:
    rng = np.random.default_rng(20260)
    makers = {"brick": _brick, "stone": _stone, "wood": _wood, "tile": _tile}
    return np.clip(np.stack([makers[k](rng) for k in WALL_KINDS]), 0.0, 1.0).astype(np.float32)


WALL_TEXTURES = _walls()
SPRITES = _sprites()
for _a in (WALL_TEXTURES, SPRITES):
    _a.setflags(write=False)
