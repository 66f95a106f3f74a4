"""The event kinds of a world-model session and how a chunk boundary applies them (pure Python).

Kinds (all ``Merge.REPLACE``: last write wins per kind within one step; the overwritten events
are listed ``completed`` without having started):

- ``key``: ``{"key": name, "down": bool}``. A key held down fills every frame of every chunk
  until it is released: the down event is ``started`` at its boundary, ``active`` after every
  step while held, and ``completed`` at the boundary that releases it (its ``up``, or another
  key's ``down``). An ``up`` event is started and completed at its boundary; a repeated ``down``
  of the held key (keyboard auto-repeat) is started and completed and changes nothing.
- ``action``: ``{"key": name}`` or ``{"keys": [name] * F}``: this chunk's keys only (overrides
  the held key for one chunk).
- ``camera``: for a model with a rig (``WorldSpec.camera``), a target pose or a velocity
  (``session/world/camera.py``: ``{"mode", "yaw", "pitch", "at_frame"?, "transition_chunks"?}``),
  ``active`` while it moves the camera, ``completed`` once it reaches its target, stops or is
  replaced; for a model with only ``camera_dim`` deltas, ``{"delta": [camera_dim floats]}`` (every
  frame) or ``{"deltas": F x camera_dim}``: this chunk only. Refused (``invalid``) by a model
  without a camera.
- ``prompt``: ``{"text": str}``: the session's prompt from this chunk on; bumps the prompt
  version (only the prompt's cross-attention K/V is recomputed).

:func:`apply_boundary` turns the held-key control state and one boundary's drained events into
the chunk's controls and the step's ``started``/``active``/``completed`` lists; it is a pure
function, so a rollback (which restores the control state and the event queue) replays it
exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from execstate.model.world.interface import CameraRig
from execstate.session.runtime.events import Drained, Event, EventKind, Merge
from execstate.session.world.camera import CameraCommand, CameraState, advance, parse_command

KEY = "key"
ACTION = "action"
CAMERA = "camera"
PROMPT = "prompt"
MAX_PROMPT_CHARS = 2000


@dataclass(frozen=True)
class HeldKey:
    """A key held down since event ``event_id``."""

    key: str
    event_id: int


@dataclass(frozen=True)
class ChunkControls:
    """What one boundary decided: the chunk's per-frame keys and camera rows (a rig's poses, or
    deltas; None: zeros), the new prompt text (None: unchanged), the held key and the camera state
    after the boundary, and the event lists."""

    keys: tuple[str, ...]
    camera: tuple[tuple[float, ...], ...] | None
    prompt: str | None
    held: HeldKey | None
    events: dict[str, list[int]]
    camera_state: CameraState | None = None


def world_event_kinds(keys: Sequence[str], frames_per_chunk: int, camera_dim: int,
                      rig: CameraRig | None = None) -> dict[str, EventKind]:
    """The kinds a world session accepts, with validators bound to the model's spec."""
    names = tuple(keys)
    pressable = [k for k in names if k != "none"]

    def key_name(value: Any, what: str, allow_none: bool) -> str:
        ok = names if allow_none else pressable
        if not isinstance(value, str) or value not in ok:
            raise ValueError(f"{what} must be one of {list(ok)}, got {value!r}")
        return value

    def key_event(data: Any) -> tuple[str, bool]:
        if not isinstance(data, Mapping) or set(data) != {"key", "down"}:
            raise ValueError("data must be {'key': name, 'down': true|false}")
        if not isinstance(data["down"], bool):
            raise ValueError(f"down must be true or false, got {data['down']!r}")
        return key_name(data["key"], "key", allow_none=False), data["down"]

    def action_event(data: Any) -> tuple[str, ...]:
        if not isinstance(data, Mapping) or len(data) != 1 or not set(data) <= {"key", "keys"}:
            raise ValueError(f"data must be {{'key': name}} or {{'keys': [{frames_per_chunk} names]}}")
        if "key" in data:
            return (key_name(data["key"], "key", allow_none=True),) * frames_per_chunk
        ks = data["keys"]
        if not isinstance(ks, list | tuple) or len(ks) != frames_per_chunk:
            raise ValueError(f"keys must be a list of {frames_per_chunk} key names (one per frame), got {ks!r}")
        return tuple(key_name(k, "keys[i]", allow_none=True) for k in ks)

    def vector(value: Any, what: str) -> tuple[float, ...]:
        if not isinstance(value, list | tuple) or len(value) != camera_dim:
            raise ValueError(f"{what} must be a list of {camera_dim} numbers, got {value!r}")
        out = []
        for x in value:
            if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
                raise ValueError(f"{what} must hold finite numbers, got {x!r}")
            out.append(float(x))
        return tuple(out)

    def camera_event(data: Any) -> tuple[tuple[float, ...], ...] | CameraCommand:
        if rig is not None:
            return parse_command(data, frames_per_chunk)
        if camera_dim == 0:
            raise ValueError("this world model has no camera (camera_dim = 0)")
        if not isinstance(data, Mapping) or len(data) != 1 or not set(data) <= {"delta", "deltas"}:
            raise ValueError(f"data must be {{'delta': [{camera_dim} numbers]}} or {{'deltas': "
                             f"[{frames_per_chunk} x {camera_dim}]}}")
        if "delta" in data:
            return (vector(data["delta"], "delta"),) * frames_per_chunk
        ds = data["deltas"]
        if not isinstance(ds, list | tuple) or len(ds) != frames_per_chunk:
            raise ValueError(f"deltas must be {frames_per_chunk} lists (one per frame)")
        return tuple(vector(d, "deltas[i]") for d in ds)

    def prompt_event(data: Any) -> str:
        if not isinstance(data, Mapping) or set(data) != {"text"}:
            raise ValueError("data must be {'text': str}")
        text = data["text"]
        if not isinstance(text, str) or len(text) > MAX_PROMPT_CHARS:
            raise ValueError(f"text must be a string of at most {MAX_PROMPT_CHARS} characters")
        return text

    return {KEY: EventKind(KEY, Merge.REPLACE, key_event),
            ACTION: EventKind(ACTION, Merge.REPLACE, action_event),
            CAMERA: EventKind(CAMERA, Merge.REPLACE, camera_event),
            PROMPT: EventKind(PROMPT, Merge.REPLACE, prompt_event)}


def apply_boundary(held: HeldKey | None, drained: Drained, frames_per_chunk: int,
                   camera: CameraState | None = None, rig: CameraRig | None = None) -> ChunkControls:
    """The chunk's controls and event lists from the held key, the camera state (with a ``rig``)
    and one boundary's events."""
    started: list[int] = []
    completed: set[int] = {e.event_id for e in drained.overwritten}
    keys: tuple[str, ...] | None = None
    rows = None
    command: tuple[int, CameraCommand] | None = None
    prompt = None
    for e in drained.applied:
        started.append(e.event_id)
        if e.kind == KEY:
            name, down = e.data
            if down and held is not None and held.key == name:
                completed.add(e.event_id)  # a repeated down (auto-repeat): the key stays one event
                continue
            if held is not None and (down or held.key == name):
                completed.add(held.event_id)  # released (or replaced by another key's down)
                held = None
            if down:
                held = HeldKey(name, e.event_id)
            else:
                completed.add(e.event_id)
        elif e.kind == CAMERA and isinstance(e.data, CameraCommand):
            command = (e.event_id, e.data)  # the camera decides when it completes
        else:
            completed.add(e.event_id)
            if e.kind == ACTION:
                keys = e.data
            elif e.kind == CAMERA:
                rows = e.data
            elif e.kind == PROMPT:
                prompt = e.data
    if keys is None:
        keys = (held.key if held is not None else "none",) * frames_per_chunk
    active = [held.event_id] if held is not None else []
    state = None
    if rig is not None:
        chunk = advance(CameraState() if camera is None else camera, command, keys, rig)
        rows, state = chunk.rows, chunk.state
        completed.update(chunk.completed)
        active += [i for i in chunk.active if i not in active]
    completed.difference_update(active)  # a composite's id whose key or camera part is still going on
    return ChunkControls(keys, rows, prompt, held, {
        "started": sorted(set(started)), "active": sorted(active), "completed": sorted(completed)}, state)


def held_after(held: HeldKey | None, pending: Iterable[Event], frames_per_chunk: int) -> HeldKey | None:
    """The held key once the ``pending`` events apply: ``KEY`` merges ``REPLACE``, so the next
    boundary applies only the last key event (``apply_boundary``)."""
    keys = [e for e in pending if e.kind == KEY]
    if not keys:
        return held
    return apply_boundary(held, Drained((keys[-1],), ()), frames_per_chunk).held
