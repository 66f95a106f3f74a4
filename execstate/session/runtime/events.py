"""A session's event queue: accepted when queued, applied only at a step boundary (docs/contracts.md 6).

Pure Python, no model. One ``EventQueue`` per session; the session kind (LM, world model, agent)
declares its event kinds (:class:`EventKind`: a validator and a merge policy), the queue does the
rest:

- ``submit(event_id, kind, data)`` validates and queues an event, returning an :class:`EventAck`.
  Ids are client-chosen ints in [0, ``MAX_EVENT_ID``] (2**63-1: every id fits the int64 fields of
  a checkpoint or a migration offer), strictly increasing per session. A duplicate id (one
  already accepted and still remembered) returns the first acknowledgement again (``duplicate``
  set) and is applied once. A lower, unknown id is ``stale``; a full queue is ``backpressure``; a
  bad kind or payload is ``invalid``; a closed queue is ``closed``. Every refusal raises
  :class:`SessionEventError` and changes nothing.
- A ``composite`` event (``data={"events": [{"kind": k, "data": d}, ...]}``) is validated whole
  and queued as one entry: it is applied whole, at one boundary, or rejected whole.
- ``drain()`` is called once per step boundary. It takes every pending event, in id order (the
  parts of a composite in their order), and merges per kind: ``APPEND`` kinds apply every event in
  order, ``REPLACE`` kinds apply only the last one (last write wins within one step); the
  overwritten ones are reported in :attr:`Drained.overwritten` so the step lists them as completed.
- ``snapshot()`` / ``restore()`` capture the control state a checkpoint keeps: pending events, the
  id watermark and the remembered acknowledgements. After a rollback the client may resubmit the
  same ids to re-run the same steps.

Memory is bounded: at most ``max_pending`` queued entries and ``remember`` acknowledgements.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NewType

from execstate.errors import CodedError

EventId = NewType("EventId", int)
"""A client-chosen event id: a non-negative int, strictly increasing within one session."""

MAX_EVENT_ID = 2**63 - 1
COMPOSITE = "composite"
MAX_COMPOSITE_PARTS = 64


class SessionEventError(CodedError):
    """An event (or a session call) was refused. ``code``: ``stale``, ``backpressure``,
    ``invalid``, ``closed`` (and, for session calls, ``failed`` / ``evicted``)."""

    def __init__(self, code: str, message: str, event_id: int | None = None) -> None:
        super().__init__(code, message)
        self.event_id = event_id


class Merge(enum.Enum):
    APPEND = "append"  # every event of the kind is applied, in order
    REPLACE = "replace"  # last write wins within one step


@dataclass(frozen=True)
class EventKind:
    """One kind of event a session accepts. ``validate(data)`` returns the normalised payload
    (immutable or private to the event) or raises ``ValueError`` saying what is wrong."""

    name: str
    merge: Merge
    validate: Callable[[Any], Any]


@dataclass(frozen=True)
class Event:
    event_id: EventId
    kind: str
    data: Any
    part: int | None = None  # index inside a composite event, None for a plain event


@dataclass(frozen=True)
class EventAck:
    event_id: EventId
    kind: str
    status: str = "accepted"
    # True when this is the answer to a resubmitted id; not part of equality, so a duplicate's
    # acknowledgement equals the first one.
    duplicate: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Drained:
    """What one step boundary applies: ``applied`` in order (after per-kind merging) and the
    events that were overwritten by a later event of the same ``REPLACE`` kind."""

    applied: tuple[Event, ...]
    overwritten: tuple[Event, ...]

    @property
    def event_ids(self) -> list[EventId]:
        """Every event id taken by this boundary, once each, in order."""
        seen: dict[EventId, None] = {}
        for e in sorted(self.applied + self.overwritten, key=lambda e: (e.event_id, e.part or 0)):
            seen.setdefault(e.event_id, None)
        return list(seen)


@dataclass(frozen=True)
class QueueSnapshot:
    pending: tuple[tuple[Event, ...], ...]
    last_id: EventId | None
    acks: tuple[tuple[EventId, EventAck], ...]


class EventQueue:
    def __init__(self, kinds: Mapping[str, EventKind], max_pending: int = 64, remember: int = 1024) -> None:
        if max_pending < 1 or remember < 1:
            raise ValueError("max_pending and remember must be >= 1")
        if COMPOSITE in kinds:
            raise ValueError(f"{COMPOSITE!r} is reserved for composite events")
        self.kinds = dict(kinds)
        self.max_pending = max_pending
        self.remember = remember
        self._pending: list[tuple[Event, ...]] = []
        self._last_id: EventId | None = None
        self._acks: OrderedDict[EventId, EventAck] = OrderedDict()
        self._closed = False
        self._snap: QueueSnapshot | None = None  # the last snapshot, shared until the queue changes

    # -- queries ------------------------------------------------------------------------------
    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def last_event_id(self) -> EventId | None:
        return self._last_id

    @property
    def closed(self) -> bool:
        return self._closed

    # -- submission ---------------------------------------------------------------------------
    def submit(self, event_id: int, kind: str, data: Any = None) -> EventAck:
        """Queue one event (see the module docstring); raises SessionEventError, changing nothing."""
        if self._closed:
            raise SessionEventError("closed", "the session is closed", _id_or_none(event_id))
        if isinstance(event_id, bool) or not isinstance(event_id, int) or not 0 <= event_id <= MAX_EVENT_ID:
            raise SessionEventError("invalid", f"event_id must be an integer in [0, 2**63-1], got {event_id!r}")
        eid = EventId(event_id)
        if eid in self._acks:
            first = self._acks[eid]
            return EventAck(first.event_id, first.kind, first.status, duplicate=True)
        if self._last_id is not None and eid <= self._last_id:
            raise SessionEventError(
                "stale", f"event_id {eid} is not above the last accepted id {self._last_id}", eid)
        parts = self._parts(eid, kind, data)
        if len(self._pending) >= self.max_pending:
            raise SessionEventError(
                "backpressure", f"{len(self._pending)} events already pending (max {self.max_pending}); "
                "step the session or retry later", eid)
        self._pending.append(parts)
        self._snap = None
        self._last_id = eid
        ack = EventAck(eid, kind)
        self._acks[eid] = ack
        while len(self._acks) > self.remember:
            self._acks.popitem(last=False)
        return ack

    def _parts(self, eid: EventId, kind: str, data: Any) -> tuple[Event, ...]:
        """Validated events of one submission (one, or a composite's parts); raises invalid."""
        if kind == COMPOSITE:
            items = data.get("events") if isinstance(data, Mapping) else None
            if not isinstance(items, list) or not items or len(items) > MAX_COMPOSITE_PARTS:
                raise SessionEventError(
                    "invalid", f"a composite event needs data={{'events': [...]}} with 1..{MAX_COMPOSITE_PARTS} "
                    "parts", eid)
            out = []
            for i, item in enumerate(items):
                if not isinstance(item, Mapping) or set(item) - {"kind", "data"} or "kind" not in item:
                    raise SessionEventError("invalid", f"composite part {i} must be {{'kind': ..., 'data': ...}}", eid)
                if item["kind"] == COMPOSITE:
                    raise SessionEventError("invalid", f"composite part {i}: composites do not nest", eid)
                out.append(Event(eid, item["kind"], self._validate(eid, item["kind"], item.get("data"), i), i))
            return tuple(out)
        return (Event(eid, kind, self._validate(eid, kind, data, None)),)

    def _validate(self, eid: EventId, kind: Any, data: Any, part: int | None) -> Any:
        where = "" if part is None else f"composite part {part}: "
        spec = self.kinds.get(kind) if isinstance(kind, str) else None
        if spec is None:
            raise SessionEventError(
                "invalid", f"{where}unknown event kind {kind!r}; this session accepts "
                f"{', '.join(sorted([*self.kinds, COMPOSITE]))}", eid)
        try:
            return spec.validate(data)
        except (ValueError, TypeError) as exc:
            raise SessionEventError("invalid", f"{where}{kind} event: {exc}", eid) from None

    # -- step boundary ------------------------------------------------------------------------
    def drain(self) -> Drained:
        """Take every pending event for this boundary, merged per kind (module docstring)."""
        events = [e for entry in self._pending for e in entry]
        self._pending = []
        self._snap = None
        last: dict[str, int] = {}
        for i, e in enumerate(events):
            if self.kinds[e.kind].merge is Merge.REPLACE:
                last[e.kind] = i
        applied: list[Event] = []
        overwritten: list[Event] = []
        for i, e in enumerate(events):
            keep = self.kinds[e.kind].merge is Merge.APPEND or last[e.kind] == i
            (applied if keep else overwritten).append(e)
        return Drained(tuple(applied), tuple(overwritten))

    def close(self) -> None:
        """Refuse every later submission (``closed``) and drop what is pending."""
        self._closed = True
        self._pending = []
        self._snap = None

    # -- checkpoints ----------------------------------------------------------------------------
    def snapshot(self) -> QueueSnapshot:
        """The queue's state (immutable; the same object until the queue changes, so checkpoints of
        an unchanged queue share it)."""
        if self._snap is None:
            self._snap = QueueSnapshot(tuple(self._pending), self._last_id, tuple(self._acks.items()))
        return self._snap

    def restore(self, snap: QueueSnapshot) -> None:
        """Back to a snapshot's pending events, id watermark and acknowledgements."""
        if self._closed:
            raise SessionEventError("closed", "the session is closed")
        self._pending = list(snap.pending)
        self._last_id = snap.last_id
        self._acks = OrderedDict(snap.acks)
        self._snap = snap


def _id_or_none(event_id: Any) -> int | None:
    ok = isinstance(event_id, int) and not isinstance(event_id, bool) and 0 <= event_id <= MAX_EVENT_ID
    return event_id if ok else None
