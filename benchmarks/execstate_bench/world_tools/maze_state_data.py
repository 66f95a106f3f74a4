"""Training data of the maze state model, from the renderer of one maze: views at random poses and
walks through it (``maze_state_train.py``).

- :func:`views`: poses drawn uniformly from where the walker can stand (its disc overlaps no wall
  and no object), any yaw, pitch within the limit half the time (else level), a random theme; the
  raycaster's frame and each column's wall distance (the ray's depth; objects are not in it).
- :func:`walks`: the player-like policy of ``maze_data.py`` (keys held 2-20 frames, the camera
  turning at held velocities, pitch now and then) from random poses, through the world's physics:
  per frame the key, the world yaw, the pose before and after. No rendering.
- :func:`clearances`: points drawn uniformly over the plan with the walker's *clearance* there
  (:func:`clearance`: how far its disc is from touching a wall or an object, in cells; < 0 where
  the physics blocks it): what the motion's free-space map learns to be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from execstate.model.world.maze import layout, pose, raycast
from execstate.model.world.maze.textures import THEME_NAMES
from execstate_bench.world_tools.maze_data import integrate, policy


def random_free_pose(maze: layout.Maze, rng: np.random.Generator, pitch: float = 0.0) -> pose.Pose:
    while True:
        x, z = rng.uniform(0.0, layout.GRID, size=2)
        if not pose.blocked(maze, float(x), float(z)):
            return pose.Pose(float(x), float(z), float(rng.uniform(0.0, 2 * math.pi)), pitch)


@dataclass(frozen=True)
class Views:
    frames: np.ndarray  # uint8 [N, H, W, 3]
    depth: np.ndarray  # float32 [N, W]: each column's wall distance along its ray
    pose: np.ndarray  # float32 [N, 4]: x, z, yaw, pitch
    theme: np.ndarray  # int64 [N]: index into THEME_NAMES


def views(maze: layout.Maze, rng: np.random.Generator, n: int) -> Views:
    frames = np.empty((n, raycast.SIZE, raycast.SIZE, 3), np.uint8)
    depth = np.empty((n, raycast.SIZE), np.float32)
    poses = np.empty((n, 4), np.float32)
    themes = rng.integers(0, len(THEME_NAMES), size=n)
    for i in range(n):
        pitch = float(rng.uniform(-pose.PITCH_LIMIT, pose.PITCH_LIMIT)) if rng.random() < 0.5 else 0.0
        p = random_free_pose(maze, rng, pitch)
        frames[i] = raycast.render(maze, p, THEME_NAMES[int(themes[i])])
        depth[i] = raycast.cast(maze, p.x, p.z, raycast.column_angles(p.yaw))[0]
        poses[i] = (p.x, p.z, p.yaw, p.pitch)
    return Views(frames, depth, poses, themes.astype(np.int64))


@dataclass(frozen=True)
class Walks:
    keys: np.ndarray  # int64 [N, T]
    yaw: np.ndarray  # float32 [N, T]: the world yaw of each frame (the move's direction)
    xz: np.ndarray  # float32 [N, T + 1, 2]: the position before frame 0, then after each frame


def walks(maze: layout.Maze, rng: np.random.Generator, n: int, length: int) -> Walks:
    keys = np.empty((n, length), np.int64)
    yaw = np.empty((n, length), np.float32)
    xz = np.empty((n, length + 1, 2), np.float32)
    for i in range(n):
        k, vel = policy(rng, length + 2, 2)
        k, cam = k[2:], integrate(k[2:], vel[2:])
        p = random_free_pose(maze, rng)
        xz[i, 0] = (p.x, p.z)
        for f in range(length):
            y = p.yaw + float(cam[f, 0])
            q = pose.step(maze, pose.Pose(p.x, p.z, p.yaw), pose.KEYS[int(k[f])], y, 0.0)
            keys[i, f], yaw[i, f], xz[i, f + 1] = k[f], y, (q.x, q.z)
            p = pose.Pose(q.x, q.z, p.yaw)
    return Walks(keys, yaw, xz)


def clearance(maze: layout.Maze, xz: np.ndarray) -> np.ndarray:
    """The walker's clearance at the points ``xz [N, 2]`` (cells): the distance from its disc to the
    nearest wall cell or object, so ``< 0`` exactly where :func:`pose.blocked` is true (the disc
    overlaps one), ``-RADIUS`` inside a wall -> ``float32 [N]``."""
    walls = np.argwhere(maze.walls > 0).astype(np.float64)  # (row, col): the cell [col, col + 1) x [row, row + 1)
    out = np.empty(len(xz), np.float32)
    for lo in range(0, len(xz), 4096):
        p = np.asarray(xz[lo : lo + 4096], np.float64)
        x, z = p[:, 0:1], p[:, 1:2]
        dx = np.maximum(np.maximum(walls[None, :, 1] - x, 0.0), x - (walls[None, :, 1] + 1.0))
        dz = np.maximum(np.maximum(walls[None, :, 0] - z, 0.0), z - (walls[None, :, 0] + 1.0))
        d = np.sqrt(dx**2 + dz**2).min(axis=1) - pose.RADIUS
        for o in maze.objects:
            d = np.minimum(d, np.hypot(p[:, 0] - o.x, p[:, 1] - o.z) - pose.RADIUS - layout.OBJECT_RADIUS)
        out[lo : lo + len(p)] = d
    return out


@dataclass(frozen=True)
class Clearances:
    xz: np.ndarray  # float32 [N, 2]: points of the plan
    clearance: np.ndarray  # float32 [N]: the walker's clearance there (:func:`clearance`)


def clearances(maze: layout.Maze, rng: np.random.Generator, n: int) -> Clearances:
    xz = rng.uniform(0.0, layout.GRID, size=(n, 2)).astype(np.float32)
    return Clearances(xz, clearance(maze, xz))
