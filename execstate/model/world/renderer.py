"""The procedural world the world model is trained on and measured against (the ground truth).

A top-down 2D maze on a 12 x 12 grid of 4-pixel cells, rendered as a 48 x 48 RGB frame:

- **walls**: a one-cell border plus a few random bars; nothing passes them;
- **agent**: a one-cell magenta square the player moves one cell per frame with a key
  (:data:`ACTIONS`: none, up, down, left, right); a move into a wall leaves it in place;
- **movers**: two one-cell squares (yellow, cyan) patrolling along one axis, one cell per
  frame; blocked ahead, a mover turns round (and moves back if that cell is free);
- **theme**: the palette of floor and walls (:data:`THEMES`), chosen by a prompt word
  (:func:`theme_for_prompt`); the agent's and movers' colours never change.

The camera is fixed (the whole world is in view), so the world has no camera action.

Everything is a pure function of its inputs: :func:`initial_state` of a seed, :func:`step` of a
state and an action, :func:`render` of a state. Frame ``k`` of a trajectory is
``render(s_k)`` with ``s_0 = initial_state(seed)`` and ``s_k = step(s_{k-1}, a_k)``; the
action of frame 0 is ignored (it is :data:`NONE` by convention). Drawing order: floor, walls,
movers (yellow, then cyan), agent on top, so the agent is always fully visible.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

FRAME = 48
CELL = 4
GRID = FRAME // CELL
SIZE = 1  # agent and movers: SIZE x SIZE cells

NONE, UP, DOWN, LEFT, RIGHT = range(5)
ACTIONS = ("none", "up", "down", "left", "right")
_DELTA = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))

AGENT_RGB = (255, 60, 220)
MOVER_RGB = ((255, 220, 40), (40, 230, 255))

# name -> (floor, wall); none of these is close to the agent's or a mover's colour.
THEMES: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "meadow": ((70, 150, 60), (110, 70, 40)),
    "desert": ((215, 185, 120), (150, 95, 50)),
    "snow": ((232, 238, 244), (110, 130, 165)),
    "night": ((20, 24, 60), (95, 85, 150)),
    "lava": ((95, 22, 12), (35, 35, 35)),
    "ocean": ((30, 90, 170), (15, 50, 75)),
}
THEME_NAMES = tuple(THEMES)
DEFAULT_THEME = "meadow"


@dataclass(frozen=True)
class Mover:
    y: int
    x: int
    dy: int  # -1, 0 or 1; exactly one of dy, dx is non-zero
    dx: int


@dataclass(frozen=True)
class SceneState:
    """One instant of the world. ``walls`` is a read-only ``bool[GRID, GRID]``; positions are the
    top-left cell of a SIZE x SIZE square."""

    walls: np.ndarray
    agent: tuple[int, int]
    movers: tuple[Mover, ...]
    theme: str
    t: int = 0


def theme_for_prompt(prompt: str) -> str:
    """The first theme name among the prompt's words (case-insensitive), else the default."""
    for word in prompt.lower().replace(",", " ").replace(".", " ").split():
        if word in THEMES:
            return word
    return DEFAULT_THEME


def _free(walls: np.ndarray, y: int, x: int) -> bool:
    return bool(0 <= y <= GRID - SIZE and 0 <= x <= GRID - SIZE and not walls[y : y + SIZE, x : x + SIZE].any())


def initial_state(seed: int, theme: str = DEFAULT_THEME) -> SceneState:
    """A random maze, agent and movers, deterministic from ``seed`` (numpy PCG64)."""
    return random_state(np.random.default_rng(seed), theme)


def random_state(rng: np.random.Generator, theme: str = DEFAULT_THEME) -> SceneState:
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; known: {', '.join(THEME_NAMES)}")
    walls = np.zeros((GRID, GRID), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    for _ in range(int(rng.integers(3, 6))):
        h, w = 1, int(rng.integers(2, 5))
        if rng.integers(2):
            h, w = w, h
        y, x = int(rng.integers(2, GRID - 2 - h + 1)), int(rng.integers(2, GRID - 2 - w + 1))
        walls[y : y + h, x : x + w] = True
    free = [(y, x) for y in range(GRID - SIZE + 1) for x in range(GRID - SIZE + 1) if _free(walls, y, x)]
    picks = rng.choice(len(free), size=1 + len(MOVER_RGB), replace=False)
    agent = free[int(picks[0])]
    movers = []
    for p in picks[1:]:
        d = 1 if rng.integers(2) else -1
        dy, dx = (d, 0) if rng.integers(2) else (0, d)
        movers.append(Mover(*free[int(p)], dy, dx))
    walls.setflags(write=False)
    return SceneState(walls, agent, tuple(movers), theme)


def _step_mover(walls: np.ndarray, m: Mover) -> Mover:
    if _free(walls, m.y + m.dy, m.x + m.dx):
        return Mover(m.y + m.dy, m.x + m.dx, m.dy, m.dx)
    dy, dx = -m.dy, -m.dx
    if _free(walls, m.y + dy, m.x + dx):
        return Mover(m.y + dy, m.x + dx, dy, dx)
    return Mover(m.y, m.x, dy, dx)


def step(state: SceneState, action: int) -> SceneState:
    """Advance one frame: the agent moves by ``action`` unless a wall blocks it; movers patrol."""
    if not 0 <= action < len(ACTIONS):
        raise ValueError(f"action must be in [0, {len(ACTIONS)}), got {action}")
    dy, dx = _DELTA[action]
    y, x = state.agent
    agent = (y + dy, x + dx) if _free(state.walls, y + dy, x + dx) else (y, x)
    movers = tuple(_step_mover(state.walls, m) for m in state.movers)
    return replace(state, agent=agent, movers=movers, t=state.t + 1)


def set_theme(state: SceneState, theme: str) -> SceneState:
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; known: {', '.join(THEME_NAMES)}")
    return replace(state, theme=theme)


def render(state: SceneState) -> np.ndarray:
    """``uint8[FRAME, FRAME, 3]``."""
    floor, wall = THEMES[state.theme]
    cells = np.empty((GRID, GRID, 3), dtype=np.uint8)
    cells[:] = floor
    cells[state.walls] = wall
    for m, rgb in zip(state.movers, MOVER_RGB, strict=False):
        cells[m.y : m.y + SIZE, m.x : m.x + SIZE] = rgb
    y, x = state.agent
    cells[y : y + SIZE, x : x + SIZE] = AGENT_RGB
    return cells.repeat(CELL, axis=0).repeat(CELL, axis=1)


def agent_center(state: SceneState) -> tuple[float, float]:
    """Pixel coordinates (row, column) of the agent's centre, as :func:`locate_agent` measures it."""
    y, x = state.agent
    return (y * CELL + SIZE * CELL / 2, x * CELL + SIZE * CELL / 2)


def locate_agent(frame: np.ndarray, tolerance: float = 60.0) -> tuple[float, float] | None:
    """Centre (row, column) of the pixels within ``tolerance`` (RGB distance) of the agent's colour,
    or ``None`` when fewer than 4 such pixels (a quarter of the agent) are present."""
    dist = np.linalg.norm(frame.astype(np.float32) - np.asarray(AGENT_RGB, np.float32), axis=-1)
    rows, cols = np.nonzero(dist <= tolerance)
    if rows.size < 4:
        return None
    return (float(rows.mean()) + 0.5, float(cols.mean()) + 0.5)


def random_actions(rng: np.random.Generator, n: int) -> np.ndarray:
    """``int64[n]`` keys as a player presses them: each key (``none`` one time in five) is held for
    1 to 8 frames."""
    out = np.empty(n, dtype=np.int64)
    i = 0
    while i < n:
        key = NONE if rng.random() < 0.2 else int(rng.integers(1, len(ACTIONS)))
        hold = int(rng.integers(1, 9))
        out[i : i + hold] = key
        i += hold
    return out


def trajectory(state: SceneState, actions: np.ndarray) -> tuple[list[SceneState], np.ndarray]:
    """States ``s_0 = state, s_k = step(s_{k-1}, actions[k])`` for ``k < len(actions)`` (``actions[0]``
    is ignored) and their frames ``uint8[len(actions), FRAME, FRAME, 3]``."""
    states = [state]
    for a in actions[1:]:
        states.append(step(states[-1], int(a)))
    return states, np.stack([render(s) for s in states])
