"""The camera of a world session whose model has a rig (``WorldSpec.camera``): pure Python.

The session integrates the camera, as vLLM-Omni's camera interaction handler does, and hands the
model each frame's pose: ``ChunkActions.camera`` rows ``(yaw, pitch, change of yaw, change of
pitch)`` in radians, session-relative (the first frame looks at yaw 0, pitch 0). A ``camera`` event
(:class:`CameraCommand`) is one of vLLM-Omni's two modes:

- ``velocity``: a turn per frame (``yaw``, ``pitch`` in radians per frame), held until another
  camera event replaces it; a zero velocity stops the camera (started and completed at once);
- ``target``: a pose to reach (``yaw``, ``pitch``, session-relative; with ``relative``, relative to
  the pose at the frame it applies from: "turn by"), interpolated linearly over
  ``transition_chunks`` chunks (``0``: at once), the shortest way round in yaw (a relative target
  turns by exactly its ``yaw``, however large); completed at the frame that reaches it.

A command takes effect at frame ``at_frame`` of the chunk that applies it (the frame its
``received_at`` maps to; ``0`` offline): the frames before keep the motion in progress. Per frame,
the motion advances, then a held turn key adds its rate (``CameraRig.turn_keys``): the key and the
camera compose (a target moves the pose by its interpolation's increments, so a key's turn during
it adds on top); pitch is clamped to the rig's limit. An event is ``started`` at its boundary,
``active`` while it moves the camera after the chunk, and ``completed`` when it reaches its target,
stops, or is replaced (listed by :func:`advance`). Everything is a function of the state and the
commands, so rollback and migration replay it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from execstate.model.world.interface import CameraRig

MODES = ("velocity", "target")
MAX_TRANSITION_CHUNKS = 1024
MAX_VELOCITY = math.pi / 2  # radians per frame
MAX_TARGET = 1e6  # radians: a session-relative yaw (turns accumulate)


@dataclass(frozen=True)
class CameraCommand:
    """A validated ``camera`` event (module docstring)."""

    mode: str
    yaw: float
    pitch: float
    at_frame: int = 0
    transition_chunks: int = 1
    relative: bool = False  # a target relative to the pose it starts from


@dataclass(frozen=True)
class CameraMotion:
    """The camera event in progress: its id, command, and for a target the turn it makes
    (``turn_yaw``, ``turn_pitch``: from the pose it started from to its target) and the frames taken
    of its ``total`` frames."""

    event_id: int
    command: CameraCommand
    turn_yaw: float = 0.0
    turn_pitch: float = 0.0
    total: int = 0
    done: int = 0


@dataclass(frozen=True)
class CameraState:
    """The pose of the session's last frame and the motion in progress."""

    yaw: float = 0.0
    pitch: float = 0.0
    motion: CameraMotion | None = None


@dataclass(frozen=True)
class CameraChunk:
    """One chunk's camera: per-frame rows for the model, the state after, and the event lists."""

    rows: tuple[tuple[float, float, float, float], ...]
    state: CameraState
    completed: tuple[int, ...]
    active: tuple[int, ...]


def _number(value: Any, what: str, bound: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or abs(
            value) > bound:
        raise ValueError(f"{what} must be a finite number within +-{bound:g}, got {value!r}")
    return float(value)


def parse_command(data: Any, frames_per_chunk: int) -> CameraCommand:
    """``{"mode", "yaw", "pitch", "at_frame"?, "transition_chunks"?, "relative"?}`` -> a command, or
    ``ValueError``."""
    if not isinstance(data, Mapping) or not {"mode"} <= set(data) <= {"mode", "yaw", "pitch", "at_frame",
                                                                        "transition_chunks", "relative"}:
        raise ValueError("camera data must be {'mode': 'velocity'|'target', 'yaw', 'pitch', 'at_frame'?, "
                         "'transition_chunks'?, 'relative'?}")
    mode = data["mode"]
    if mode not in MODES:
        raise ValueError(f"camera mode must be one of {list(MODES)}, got {mode!r}")
    bound = MAX_VELOCITY if mode == "velocity" else MAX_TARGET
    yaw = _number(data.get("yaw", 0.0), "yaw", bound)
    pitch = _number(data.get("pitch", 0.0), "pitch", bound)
    at = data.get("at_frame", 0)
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < frames_per_chunk:
        raise ValueError(f"at_frame must be an int in [0, {frames_per_chunk}), got {at!r}")
    tc = data.get("transition_chunks", 1)
    if isinstance(tc, bool) or not isinstance(tc, int) or not 0 <= tc <= MAX_TRANSITION_CHUNKS:
        raise ValueError(f"transition_chunks must be an int in [0, {MAX_TRANSITION_CHUNKS}], got {tc!r}")
    relative = data.get("relative", False)
    if not isinstance(relative, bool):
        raise ValueError(f"relative must be true or false, got {relative!r}")
    if mode == "velocity" and ("transition_chunks" in data or relative):
        raise ValueError("transition_chunks and relative apply to a target, not a velocity")
    return CameraCommand(mode, yaw, pitch, at, tc, relative)


def command_to_data(cmd: CameraCommand) -> dict[str, float | int | str | bool]:
    """A command as a client submits it (``parse_command``'s inverse)."""
    data: dict[str, float | int | str | bool] = {"mode": cmd.mode, "yaw": cmd.yaw, "pitch": cmd.pitch,
                                          "at_frame": cmd.at_frame}
    if cmd.mode == "target":
        data["transition_chunks"] = cmd.transition_chunks
        if cmd.relative:
            data["relative"] = True
    return data


def _wrap(angle: float) -> float:
    """``angle`` in ``[-pi, pi)``."""
    return (angle + math.pi) % (2 * math.pi) - math.pi


def _activate(state: CameraState, event_id: int, cmd: CameraCommand, f: int) -> CameraMotion | None:
    if cmd.mode == "velocity":
        return None if cmd.yaw == 0.0 and cmd.pitch == 0.0 else CameraMotion(event_id, cmd)
    if cmd.relative:
        return CameraMotion(event_id, cmd, cmd.yaw, cmd.pitch, cmd.transition_chunks * f, 0)
    return CameraMotion(event_id, cmd, _wrap(cmd.yaw - state.yaw), cmd.pitch - state.pitch,
                        cmd.transition_chunks * f, 0)


def advance(state: CameraState, command: tuple[int, CameraCommand] | None, keys: tuple[str, ...],
            rig: CameraRig) -> CameraChunk:
    """One chunk of ``len(keys)`` frames from ``state`` with this boundary's command (if any)."""
    f = len(keys)
    turns = dict(rig.turn_keys)
    yaw, pitch, motion = state.yaw, state.pitch, state.motion
    completed: list[int] = []
    rows = []
    for i in range(f):
        if command is not None and command[1].at_frame == i:
            event_id, cmd = command
            if motion is not None:
                completed.append(motion.event_id)  # replaced
            motion = _activate(CameraState(yaw, pitch), event_id, cmd, f)
            if motion is None:
                completed.append(event_id)  # a zero velocity: the camera stops
        new_yaw, new_pitch = yaw, pitch
        if motion is not None and motion.command.mode == "velocity":
            new_yaw += motion.command.yaw
            new_pitch += motion.command.pitch
        elif motion is not None:
            done = motion.done + 1
            alpha = 1.0 if motion.total == 0 else min(1.0, done / motion.total)
            before = 0.0 if motion.total == 0 else min(1.0, motion.done / motion.total)
            new_yaw += motion.turn_yaw * (alpha - before)  # the interpolation's increment this frame
            new_pitch += motion.turn_pitch * (alpha - before)
            motion = CameraMotion(motion.event_id, motion.command, motion.turn_yaw, motion.turn_pitch, motion.total,
                                  done)
            if alpha >= 1.0:
                completed.append(motion.event_id)
                motion = None
        new_yaw += turns.get(keys[i], 0.0)
        new_pitch = min(max(new_pitch, -rig.pitch_limit), rig.pitch_limit)
        rows.append((new_yaw, new_pitch, new_yaw - yaw, new_pitch - pitch))
        yaw, pitch = new_yaw, new_pitch
    active = () if motion is None else (motion.event_id,)
    return CameraChunk(tuple(rows), CameraState(yaw, pitch, motion), tuple(completed), active)
