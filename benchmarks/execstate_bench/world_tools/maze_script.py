"""The scripted play of the maze quality bench: a player who knows the maze, deterministic from a seed.

It walks forward until a wall stops it (and keeps pushing into it for a few chunks), then turns
towards an open way (with the camera: a target over 2 to 6 chunks; or holding a turn key for
exactly 90 degrees); every so often it spins a full turn on the spot (a revisit of every
direction: with the camera, 8 columns a frame, 16 chunks; or with the turn key, 4 columns a frame,
32 chunks), turns round and walks back the way it came (a revisit of a corridor), strafes into a
wall, sweeps the camera at a held velocity and stops it, looks up and down, or stands still.
:meth:`ScriptedPlayer.next` gives each chunk's held key, its camera event (if any) and a label.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from execstate.model.world.maze import layout, pose

SPIN_EVERY = 150
BACKTRACK_EVERY = 110


@dataclass(frozen=True)
class Control:
    key: str  # held through the chunk
    camera: dict[str, Any] | None  # a camera event's data (session/world/camera.py), applied at this chunk
    label: str


def _open_dirs(maze: layout.Maze, p: pose.Pose) -> list[float]:
    """World yaws (multiples of 90 degrees) of the open neighbours of the walker's cell."""
    r, c = int(p.z), int(p.x)
    out = []
    for yaw, dr, dc in ((0.0, 0, 1), (math.pi / 2, 1, 0), (math.pi, 0, -1), (-math.pi / 2, -1, 0)):
        if not maze.is_wall(r + dr, c + dc):
            out.append(yaw)
    return out


def _wrap(a: float) -> float:
    return (a + math.pi) % (2 * math.pi) - math.pi


class ScriptedPlayer:
    def __init__(self, maze: layout.Maze, seed: int) -> None:
        self.maze = maze
        self.rng = np.random.default_rng(seed)
        self.plan: deque[Control] = deque()
        self.chunk = 0
        self.blocked_for = 0
        self.last_key = "none"
        self.next_spin, self.next_backtrack = SPIN_EVERY, BACKTRACK_EVERY
        self.spins = 0

    def _turn_to(self, world_yaw: float, rel_yaw: float, p: pose.Pose) -> None:
        """Face ``world_yaw`` (``rel_yaw``: the session-relative yaw now, ``p.yaw``: the world's)."""
        delta = _wrap(world_yaw - p.yaw)
        cols = round(delta / pose.DTHETA)
        if cols % 8 == 0 and cols and self.rng.random() < 0.4:  # a turn key, whole chunks of 8 columns
            key = "turn_right" if cols > 0 else "turn_left"
            self.plan.extend(Control(key, None, "turn key") for _ in range(abs(cols) // 8))
            return
        n = int(self.rng.integers(2, 7))
        self.plan.append(Control("none", {"mode": "target", "yaw": rel_yaw + delta, "pitch": 0.0,
                                          "transition_chunks": n}, "turn camera"))
        self.plan.extend(Control("none", None, "turn camera") for _ in range(n))

    def next(self, p: pose.Pose, rel_yaw: float, moved: bool) -> Control:
        """The next chunk's control from the true pose ``p`` (its session-relative yaw ``rel_yaw``);
        ``moved``: whether the last chunk's key moved the walker."""
        if moved:
            self.blocked_for = 0
        elif self.last_key in ("forward", "back", "left", "right"):
            self.blocked_for += 1  # pushed and did not move: a wall
        self.chunk += 1
        if not self.plan:
            self._decide(p, rel_yaw)
        control = self.plan.popleft()
        self.last_key = control.key
        return control

    def _decide(self, p: pose.Pose, rel_yaw: float) -> None:
        rng = self.rng
        if self.chunk >= self.next_spin:  # a full turn on the spot: the camera (16 chunks) or the turn key (32)
            self.next_spin += SPIN_EVERY
            self.spins += 1
            if self.spins % 2:
                v = 8 * pose.DTHETA
                self.plan.append(Control("none", {"mode": "velocity", "yaw": v, "pitch": 0.0}, "spin camera"))
                self.plan.extend(Control("none", None, "spin camera") for _ in range(15))
                self.plan.append(Control("none", {"mode": "velocity", "yaw": 0.0, "pitch": 0.0}, "stand"))
            else:
                self.plan.extend(Control("turn_left", None, "spin key") for _ in range(32))
            return
        if self.chunk >= self.next_backtrack:
            self.next_backtrack += BACKTRACK_EVERY
            self._turn_to(p.yaw + math.pi, rel_yaw, p)
            self.plan.extend(Control("forward", None, "walk back") for _ in range(int(rng.integers(8, 20))))
            return
        if self.blocked_for >= 3:  # pushed into a wall long enough: find a way on
            ahead = round(p.yaw / (math.pi / 2)) * (math.pi / 2)
            dirs = [d for d in _open_dirs(self.maze, p) if abs(_wrap(d - ahead)) > 0.1] or [ahead + math.pi]
            self._turn_to(float(dirs[int(rng.integers(len(dirs)))]), rel_yaw, p)
            self.blocked_for = 0
            return
        u = rng.random()
        if u < 0.06:
            key = "left" if rng.random() < 0.5 else "right"
            self.plan.extend(Control(key, None, "strafe") for _ in range(6))
        elif u < 0.11:
            v = float(rng.choice([-2.0, 2.0])) * pose.DTHETA
            self.plan.append(Control("forward", {"mode": "velocity", "yaw": v, "pitch": 0.0}, "sweep"))
            self.plan.extend(Control("forward", None, "sweep") for _ in range(5))
            self.plan.append(Control("none", {"mode": "velocity", "yaw": 0.0, "pitch": 0.0}, "sweep"))
        elif u < 0.14:
            up = float(rng.uniform(0.15, 0.35)) * (1 if rng.random() < 0.5 else -1)
            self.plan.append(Control("none", {"mode": "target", "yaw": rel_yaw, "pitch": up, "transition_chunks": 3},
                                     "look"))
            self.plan.extend(Control("none", None, "look") for _ in range(3))
            self.plan.append(Control("none", {"mode": "target", "yaw": rel_yaw, "pitch": 0.0, "transition_chunks": 3},
                                     "look"))
            self.plan.extend(Control("none", None, "look") for _ in range(3))
        elif u < 0.17:
            self.plan.extend(Control("none", None, "stand") for _ in range(3))
        elif u < 0.2:
            self.plan.extend(Control("back", None, "back") for _ in range(4))
        else:
            self.plan.append(Control("forward", None, "walk"))
