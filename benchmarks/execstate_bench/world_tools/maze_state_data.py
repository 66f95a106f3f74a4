"""Training data of the maze state model, from the renderer of one maze: views at random poses and
walks through it (``maze_state_train.py``).

- :func:`views`: poses drawn uniformly from where the walker can stand (its disc overlaps no wall
  and no object), any yaw, pitch within the limit half the time (else level), a random theme; the
  raycaster's frame and each column's wall distance (the ray's depth; objects are not in it).
- :func:`walks`: the player-like policy of ``maze_data.py`` (keys held 2-20 frames, the camera
  turning at held velocities, pitch now and then) from random poses, through the world's physics:
  per frame the key, the world yaw, the pose before and after. No rendering.
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
