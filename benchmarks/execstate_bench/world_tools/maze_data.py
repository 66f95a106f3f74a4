"""Trajectories of the maze world for training: a walker played by a random but player-like policy,
rendered by the raycaster (the ground truth at every frame).

A trajectory starts the way a session does: frames ``0 .. F - 1`` at the start pose with no key
and no turn (the session's first chunk, rendered); then the policy holds a key for 2 to 20 frames
at a time (forward most often, so walls are walked into; turns and strafes; pauses) while the
camera turns at a held velocity for 2 to 16 frames at a time (still about half the time) and now
and then pitches. The camera is integrated as a session integrates it (``session/world/camera.py``:
the turn keys add their rate, pitch is clamped) and the pose moves by the world's physics
(``maze/pose.py``). Per frame: the key, and the camera row the model gets (session-relative yaw and
pitch, their change since the frame before).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from execstate.model.world.maze import layout, pose, raycast
from execstate.model.world.maze.textures import THEME_NAMES

KEY_P = {"none": 0.14, "forward": 0.36, "back": 0.08, "left": 0.08, "right": 0.08, "turn_left": 0.13,
         "turn_right": 0.13}
MAX_YAW_COLUMNS = 6.0  # the camera's turn per frame, at most (columns of the raycaster)
_FILLER = ("a", "the", "maze", "of", "walls", "dark", "long", "corridors", "old", "quiet")


@dataclass(frozen=True)
class Trajectory:
    """A walk and its frames; a frame is rendered the first time it is read (training reads few)."""

    maze: layout.Maze
    theme: str
    prompt: str
    keys: np.ndarray  # int64 [T] (ids into pose.KEYS)
    camera: np.ndarray  # float32 [T, 4]: yaw, pitch (session-relative), their change since the frame before
    poses: tuple[pose.Pose, ...]
    rendered: dict[int, np.ndarray] = dataclasses.field(default_factory=dict, compare=False)

    def __len__(self) -> int:
        return len(self.poses)

    def frame(self, i: int) -> np.ndarray:
        """uint8 ``[H, W, 3]``: the raycaster's view at pose ``i``."""
        if i not in self.rendered:
            self.rendered[i] = raycast.render(self.maze, self.poses[i], self.theme)
        return self.rendered[i]

    def frames(self, start: int, stop: int) -> np.ndarray:
        return np.stack([self.frame(i) for i in range(start, stop)])


def random_prompt(rng: np.random.Generator, theme: str) -> str:
    words = [str(w) for w in rng.choice(_FILLER, size=int(rng.integers(0, 4)))]
    words.insert(int(rng.integers(0, len(words) + 1)), theme)
    return " ".join(words)


def policy(rng: np.random.Generator, n: int, frames_per_chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys ``int64[n]`` and camera velocities ``float64[n, 2]`` (yaw, pitch per frame; radians)."""
    names = list(KEY_P)
    probs = np.array([KEY_P[k] for k in names])
    keys = np.zeros(n, np.int64)
    vel = np.zeros((n, 2))
    i = frames_per_chunk
    while i < n:
        hold = int(rng.integers(2, 21))
        keys[i : i + hold] = pose.KEYS.index(names[int(rng.choice(len(names), p=probs))])
        i += hold
    i = frames_per_chunk
    while i < n:
        hold = int(rng.integers(2, 17))
        if rng.random() < 0.5:
            vel[i : i + hold, 0] = rng.uniform(-MAX_YAW_COLUMNS, MAX_YAW_COLUMNS) * pose.DTHETA
        if rng.random() < 0.2:
            vel[i : i + hold, 1] = rng.uniform(-2.0, 2.0) * pose.DTHETA
        i += hold
    return keys, vel


def integrate(keys: np.ndarray, vel: np.ndarray) -> np.ndarray:
    """The camera rows ``float32[n, 4]`` a session computes for these keys and velocities."""
    out = np.zeros((len(keys), 4), np.float64)
    yaw = pitch = 0.0
    for i in range(len(keys)):
        new_yaw = yaw + vel[i, 0] + pose.TURN_KEYS.get(pose.KEYS[int(keys[i])], 0.0)
        new_pitch = pose.clamp_pitch(pitch + vel[i, 1])
        out[i] = (new_yaw, new_pitch, new_yaw - yaw, new_pitch - pitch)
        yaw, pitch = new_yaw, new_pitch
    return out.astype(np.float32)


def walk(maze: layout.Maze, start: pose.Pose, keys: np.ndarray, camera: np.ndarray) -> tuple[pose.Pose, ...]:
    """The poses for ``keys`` and integrated ``camera`` rows from ``start`` (frame 0 is at ``start``
    turned by ``camera[0]``): the world's physics, no rendering."""
    poses = []
    p = start
    for i in range(len(keys)):
        yaw = start.yaw + float(camera[i, 0])
        p = pose.step(maze, p, pose.KEYS[int(keys[i])], yaw, float(camera[i, 1]))
        poses.append(p)
    return tuple(poses)


def random_trajectory(rng: np.random.Generator, n: int, frames_per_chunk: int) -> Trajectory:
    maze = layout.generate(int(rng.integers(0, 2**31)))
    theme = THEME_NAMES[int(rng.integers(len(THEME_NAMES)))]
    start = pose.start_pose(maze)
    if rng.random() < 0.5:  # any direction, not only along a corridor
        start = pose.Pose(start.x, start.z, float(rng.uniform(0, 2 * math.pi)), 0.0)
    keys, vel = policy(rng, n, frames_per_chunk)
    camera = integrate(keys, vel)
    return Trajectory(maze, theme, random_prompt(rng, theme), keys, camera, walk(maze, start, keys, camera))
