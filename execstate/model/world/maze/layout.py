"""A procedural maze: the layout the raycaster renders and the walker collides with.

The maze is a ``GRID x GRID`` grid of unit cells (world coordinates: ``x`` is the column, ``z``
the row, cell ``(row, col)`` covers ``[col, col + 1) x [row, row + 1)``). A cell is open or a wall
of one of the wall kinds (``walls[row, col]`` in ``0`` (open) .. ``len(WALL_KINDS)``). Built by
:func:`generate` from a seed, deterministic (numpy PCG64):

- a one-cell border of walls;
- corridors one cell wide carved by a depth-first maze over the odd cells, then about a fifth of
  the walls between two corridors knocked down (loops: a walker can come back another way) and
  one or two 3 x 3 rooms opened up;
- wall kinds in patches (each wall cell takes the kind of the nearest of a few random seeds), so
  a corridor's two sides and the rooms look different and a view can be told from another;
- a few objects (:data:`OBJECT_KINDS`) standing in open cells: each blocks the walker like a
  pillar of radius :data:`OBJECT_RADIUS`;
- a start pose: the centre of an open cell, facing along an open corridor.

The layout is immutable (read-only arrays), so it can be shared by every render and step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = 15
WALL_KINDS = ("brick", "stone", "wood", "tile")
OBJECT_KINDS = ("barrel", "plant", "lamp")
OBJECT_RADIUS = 0.3
_ROOMS = (1, 2)
_KNOCK = 0.2
_OBJECTS = (4, 7)


@dataclass(frozen=True)
class MazeObject:
    x: float
    z: float
    kind: int  # index into OBJECT_KINDS


@dataclass(frozen=True)
class Maze:
    """``walls uint8[GRID, GRID]`` (0 open, k: wall kind k - 1), the objects and the start pose
    (cell centre ``start_x, start_z`` and ``start_yaw`` in radians, 0 = +x, counter-clockwise
    towards +z)."""

    seed: int
    walls: np.ndarray
    objects: tuple[MazeObject, ...]
    start_x: float
    start_z: float
    start_yaw: float

    def is_wall(self, row: int, col: int) -> bool:
        if not (0 <= row < GRID and 0 <= col < GRID):
            return True
        return bool(self.walls[row, col])


def _carve(rng: np.random.Generator, open_: np.ndarray) -> None:
    """Depth-first maze over the odd cells (iterative, so deterministic and without recursion)."""
    nodes = range(1, GRID - 1, 2)
    start = (int(rng.choice(list(nodes))), int(rng.choice(list(nodes))))
    open_[start] = True
    stack = [start]
    while stack:
        r, c = stack[-1]
        nbrs = [(r + dr, c + dc, dr, dc) for dr, dc in ((-2, 0), (2, 0), (0, -2), (0, 2))
                if 1 <= r + dr < GRID - 1 and 1 <= c + dc < GRID - 1 and not open_[r + dr, c + dc]]
        if not nbrs:
            stack.pop()
            continue
        nr, nc, dr, dc = nbrs[int(rng.integers(len(nbrs)))]
        open_[r + dr // 2, c + dc // 2] = True
        open_[nr, nc] = True
        stack.append((nr, nc))


def _knock_and_rooms(rng: np.random.Generator, open_: np.ndarray) -> None:
    for r in range(1, GRID - 1):
        for c in range(1, GRID - 1):
            if open_[r, c]:
                continue
            horiz = open_[r, c - 1] and open_[r, c + 1] and not open_[r - 1, c] and not open_[r + 1, c]
            vert = open_[r - 1, c] and open_[r + 1, c] and not open_[r, c - 1] and not open_[r, c + 1]
            if (horiz or vert) and rng.random() < _KNOCK:
                open_[r, c] = True
    for _ in range(int(rng.integers(_ROOMS[0], _ROOMS[1] + 1))):
        r, c = int(rng.integers(1, GRID - 4)), int(rng.integers(1, GRID - 4))
        open_[r : r + 3, c : c + 3] = True


def _kinds(rng: np.random.Generator, open_: np.ndarray) -> np.ndarray:
    seeds = rng.integers(0, GRID, size=(6, 2))
    kinds = rng.integers(1, len(WALL_KINDS) + 1, size=len(seeds))
    rr, cc = np.mgrid[0:GRID, 0:GRID]
    d = (rr[None] - seeds[:, 0, None, None]) ** 2 + (cc[None] - seeds[:, 1, None, None]) ** 2
    walls = kinds[np.argmin(d, axis=0)].astype(np.uint8)
    walls[open_] = 0
    return walls


def generate(seed: int) -> Maze:
    """The maze of ``seed`` (module docstring)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"a maze seed must be a non-negative int, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    open_ = np.zeros((GRID, GRID), dtype=bool)
    _carve(rng, open_)
    _knock_and_rooms(rng, open_)
    walls = _kinds(rng, open_)
    cells = np.argwhere(open_)
    order = rng.permutation(len(cells))
    start = cells[order[0]]
    objects: list[MazeObject] = []
    n_objects = int(rng.integers(_OBJECTS[0], _OBJECTS[1] + 1))
    for idx in order[1:]:
        if len(objects) >= n_objects:
            break
        r, c = cells[idx]
        if abs(int(r) - int(start[0])) + abs(int(c) - int(start[1])) < 3:
            continue
        objects.append(MazeObject(float(c) + 0.5, float(r) + 0.5, int(rng.integers(len(OBJECT_KINDS)))))
    r0, c0 = int(start[0]), int(start[1])
    dirs = [(a, dr, dc) for a, dr, dc in ((0.0, 0, 1), (np.pi / 2, 1, 0), (np.pi, 0, -1), (-np.pi / 2, -1, 0))
            if open_[r0 + dr, c0 + dc]]
    yaw = float(dirs[int(rng.integers(len(dirs)))][0]) if dirs else 0.0
    walls.setflags(write=False)
    return Maze(int(seed), walls, tuple(objects), c0 + 0.5, r0 + 0.5, yaw)
