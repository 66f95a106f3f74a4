"""Events of one world session, applied at chunk boundaries (pure Python: no model, no server).

Client events (held keys, prompt changes) are *submitted* at any time and *applied* at the next
chunk boundary, in arrival order; :meth:`BoundaryEvents.boundary` drains them and says what the
step uses and which events it lists:

- **held key**: ``key_down`` starts an event (its id) at the next boundary; it stays *active* in
  every step while the key is held and *completes* at the boundary after ``key_up``. A key pressed
  and released before one boundary (a tap) is started, active and completed in that one step, so
  it acts for one chunk. Every frame of a step uses one key: of the held keys, the one pressed
  last (last write wins); none held: ``none``.
- **action** (vLLM-Omni ``multi_modal_data.action`` with ``mode: velocity``): the held keys become
  exactly the listed ones, as one event, until released (``key.up``) or replaced by the next action.
- **prompt**: applied at the boundary (started, active and completed in that step); of several
  before one boundary, the last one's text applies (all are listed).

Out-of-order input is refused before anything changes (``WorldProtocolError``): a key that is not
the model's (``unknown_key``), ``key.down`` of a key already held (``key_already_held``),
``key.up`` of a key not held (``key_not_held``), an event id used before (``event_id_conflict``;
the last ``ID_MEMORY`` ids are remembered), more than ``max_pending`` events waiting for a
boundary (``backpressure``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from execstate.serve.world_protocol import WorldProtocolError

ID_MEMORY = 4096


@dataclass(frozen=True)
class Boundary:
    """What one step uses and lists: its key (an index into the model's keys), the prompt applied
    at this boundary (``None``: unchanged), and the step's events."""

    key: int
    prompt: str | None
    started: tuple[str, ...]
    active: tuple[str, ...]
    completed: tuple[str, ...]


class BoundaryEvents:
    def __init__(self, keys: tuple[str, ...], max_pending: int = 64) -> None:
        self.keys = keys
        self.max_pending = max_pending
        self._pending: list[tuple[str, str, object]] = []  # (op, event id, value) in arrival order
        self._logical: dict[str, str] = {}  # key -> event id, as if every pending event were applied
        self._held: dict[str, str] = {}  # key -> event id, applied (insertion order = press order)
        self._ids: collections.deque[str] = collections.deque(maxlen=ID_MEMORY)
        self._id_set: set[str] = set()

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    # -- submitting (validated, nothing applied) -----------------------------------------------------
    def key_down(self, event_id: str, key: str) -> None:
        self._check_key(key, event_id)
        if key in self._logical:
            raise WorldProtocolError("key_already_held", f"key {key!r} is already held (event "
                                     f"{self._logical[key]}); send key.up first", event_id)
        self._admit(event_id)
        self._logical[key] = event_id
        self._pending.append(("down", event_id, key))

    def key_up(self, event_id: str, key: str) -> str:
        """Release ``key``; returns the id of the held-key event it ends."""
        self._check_key(key, event_id)
        if key not in self._logical:
            raise WorldProtocolError("key_not_held", f"key.up for {key!r}, which is not held", event_id)
        self._admit(event_id)
        down = self._logical.pop(key)
        self._pending.append(("up", down, key))
        return down

    def interaction(self, event_id: str, keys: list[str] | None = None, prompt: str | None = None) -> None:
        """One event that holds exactly ``keys`` from the next boundary (an action: released by
        ``key.up`` or replaced by the next action) and/or changes the prompt; validated whole first."""
        if keys is None and prompt is None:
            raise WorldProtocolError("invalid_message", "an interaction needs a prompt or an action", event_id)
        for key in keys or ():
            self._check_key(key, event_id)
        if keys is not None and len(set(keys)) != len(keys):
            raise WorldProtocolError("invalid_message", f"action keys repeat: {keys}", event_id)
        extra = (0 if keys is None else len(self._logical) + len(keys)) + (prompt is not None)
        self._admit(event_id, extra)
        if keys is not None:
            for key, down in list(self._logical.items()):
                self._pending.append(("up", down, key))
            self._logical = dict.fromkeys(keys, event_id)
            self._pending.extend(("down", event_id, key) for key in keys)
        if prompt is not None:
            self._pending.append(("prompt", event_id, prompt))

    def _check_key(self, key: str, event_id: str) -> None:
        if key not in self.keys or key == self.keys[0]:
            raise WorldProtocolError("unknown_key", f"unknown key {key!r}; this model's keys are "
                                     f"{', '.join(self.keys[1:])}", event_id)

    def _admit(self, event_id: str, extra: int = 1) -> None:
        if event_id in self._id_set:
            raise WorldProtocolError("event_id_conflict", f"event id {event_id!r} was used before in this session",
                                     event_id)
        if len(self._pending) + extra > self.max_pending:
            raise WorldProtocolError("backpressure", f"more than {self.max_pending} events are waiting for the next "
                                     "chunk boundary", event_id)
        if len(self._ids) == self._ids.maxlen:
            self._id_set.discard(self._ids[0])
        self._ids.append(event_id)
        self._id_set.add(event_id)

    # -- the boundary ------------------------------------------------------------------------------
    def boundary(self) -> Boundary:
        """Apply every pending event (in arrival order); what the next step uses and lists."""
        started: dict[str, None] = {}
        completed: dict[str, None] = {}
        taps: dict[str, str] = {}  # key -> event id, pressed and released at this boundary
        prompts: dict[str, None] = {}
        prompt: str | None = None
        pressed_now: dict[str, str] = {}
        for op, eid, value in self._pending:
            key = str(value)
            if op == "down":
                self._held[key] = pressed_now[key] = eid
                started[eid] = None
            elif op == "up":
                self._held.pop(key, None)
                if pressed_now.get(key) == eid:
                    taps.pop(key, None)
                    taps[key] = eid
                if eid not in self._held.values():
                    completed[eid] = None
            else:
                prompt = key
                started[eid] = prompts[eid] = None
                if eid not in self._held.values():  # a composite with held keys completes on release
                    completed[eid] = None
        self._pending.clear()
        if self._held:
            key = next(reversed(self._held))
        elif taps:
            key = next(reversed(taps))
        else:
            key = self.keys[0]
        active = dict.fromkeys(self._held.values()) | dict.fromkeys(taps.values()) | prompts
        return Boundary(self.keys.index(key), prompt, tuple(started), tuple(active), tuple(completed))
