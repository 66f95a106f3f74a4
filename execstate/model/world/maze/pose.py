"""The walker of the maze world: its pose, its keys and the physics that moves it.

A pose is a position ``(x, z)`` in cells, a ``yaw`` (radians; 0 looks along +x, growing to the
walker's right, towards +z) and a ``pitch`` (radians; > 0 looks up). The camera is at the
walker's eye, half a cell above the floor.

Per frame, the rotation comes first (the camera's yaw and pitch, :data:`TURN_KEYS` add
``TURN_RATE`` to the yaw while held), then the movement key moves the walker in the new facing:
:data:`KEYS` ``forward`` / ``back`` by ``MOVE_SPEED`` cells, ``left`` / ``right`` strafe by
``STRAFE_SPEED``. The walker is a disc of radius :data:`RADIUS`: a move is taken along x, then
along z, each only if the disc then overlaps no wall cell and no object (so it slides along a
wall it walks into, and stops dead at a wall straight ahead). Rotation is never blocked, so the
camera's angles are exactly what the client steered; the position is the world's to decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from execstate.model.world.maze.layout import GRID, OBJECT_RADIUS, Maze

KEYS = ("none", "forward", "back", "left", "right", "turn_left", "turn_right")
COLUMNS_PER_TURN = 256  # the raycaster's columns around a full circle
DTHETA = 2 * math.pi / COLUMNS_PER_TURN  # radians per column (and per pixel row at the horizon)
TURN_RATE = 4 * DTHETA  # radians per frame while a turn key is held (64 frames a full turn)
TURN_KEYS = {"turn_left": -TURN_RATE, "turn_right": TURN_RATE}
MOVE_SPEED = 0.1
STRAFE_SPEED = 0.08
RADIUS = 0.25
PITCH_LIMIT = 16 * DTHETA  # the horizon moves at most 16 rows up or down
_MOVES = {"forward": (MOVE_SPEED, 0.0), "back": (-MOVE_SPEED, 0.0), "left": (0.0, -STRAFE_SPEED),
          "right": (0.0, STRAFE_SPEED)}


@dataclass(frozen=True)
class Pose:
    x: float
    z: float
    yaw: float
    pitch: float = 0.0


def start_pose(maze: Maze) -> Pose:
    return Pose(maze.start_x, maze.start_z, maze.start_yaw, 0.0)


def blocked(maze: Maze, x: float, z: float) -> bool:
    """Whether the walker's disc at ``(x, z)`` overlaps a wall cell or an object."""
    for row in range(int(math.floor(z - RADIUS)), int(math.floor(z + RADIUS)) + 1):
        for col in range(int(math.floor(x - RADIUS)), int(math.floor(x + RADIUS)) + 1):
            if not maze.is_wall(row, col):
                continue
            nx = min(max(x, col), col + 1)
            nz = min(max(z, row), row + 1)
            if (x - nx) ** 2 + (z - nz) ** 2 < RADIUS**2:
                return True
    return any((x - o.x) ** 2 + (z - o.z) ** 2 < (RADIUS + OBJECT_RADIUS) ** 2 for o in maze.objects)


def step(maze: Maze, pose: Pose, key: str, yaw: float, pitch: float) -> Pose:
    """The next frame's pose: the camera's angles ``yaw``, ``pitch`` (already integrated, with
    the turn keys' rate; ``clamp_pitch``), then ``key``'s move with collision (module docstring)."""
    if key not in KEYS:
        raise ValueError(f"key must be one of {list(KEYS)}, got {key!r}")
    fwd, side = _MOVES.get(key, (0.0, 0.0))
    x, z = pose.x, pose.z
    if fwd or side:
        dx = fwd * math.cos(yaw) - side * math.sin(yaw)
        dz = fwd * math.sin(yaw) + side * math.cos(yaw)
        if not blocked(maze, x + dx, z):
            x += dx
        if not blocked(maze, x, z + dz):
            z += dz
    if not (0 < x < GRID and 0 < z < GRID):
        raise AssertionError("the walker left the maze")  # the border walls make this impossible
    return Pose(x, z, yaw, pitch)


def clamp_pitch(pitch: float) -> float:
    return min(max(pitch, -PITCH_LIMIT), PITCH_LIMIT)


def crossed_wall(maze: Maze, a: Pose, b: Pose, samples: int = 8) -> bool:
    """Whether the straight segment from ``a`` to ``b`` passes through a wall cell (a walker that
    went from one to the other walked through a wall)."""
    for i in range(samples + 1):
        t = i / samples
        x, z = a.x + (b.x - a.x) * t, a.z + (b.z - a.z) * t
        if maze.is_wall(int(math.floor(z)), int(math.floor(x))):
            return True
    return False
