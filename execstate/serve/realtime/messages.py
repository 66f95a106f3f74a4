"""Client messages and their registry: one JSON object per text frame, its ``type`` picks the struct.

A protocol declares each client message as a :class:`Message` subclass whose ``tag`` is its
``type`` and which has an ``event_id`` field (the id the server echoes in the answer and in every
``error`` it causes), and lists them in a :class:`MessageTable`::

    class Ping(Message, tag="ping"):
        event_id: EventId = None

    MESSAGES = MessageTable(Ping, Pong)

``MessageTable.decode`` turns a frame into the typed message or raises ``ProtocolError``:
``message_too_large`` (over the protocol's bound), ``invalid_message`` for JSON nested deeper than
the protocol's ``max_json_depth`` (measured before any decoder recurses: ``serve/json_depth.py``),
``unknown_type`` (a ``type`` not in ``types``) or ``invalid_message`` naming the problem, with the
frame's ``event_id`` when it could be read. Unknown fields are refused (``forbid_unknown_fields``).
An ``event_id`` is an integer of int64's range or a string of 1 to ``max_event_id_chars`` (128)
characters (else ``invalid_message``): ids are echoed, logged and carried into session state, so
they are bounded like everything else.

**Renamed types.** A protocol that renames a message lists the old name as a :class:`Renamed`:
the old ``type`` is decoded as the new message (deprecated, for one release, and documented with
its new name), and the connection that sent it gets the renamed server events of ``answers`` under
their old names (``connection.py``), so a client written against the old names works unchanged.

Server events are plain dicts (``server_event``), written as JSON text frames in order.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union, cast

import msgspec

from execstate.serve.json_depth import MAX_JSON_DEPTH, depth_message, too_deep
from execstate.serve.realtime.errors import EventId, ProtocolError

MAX_EVENT_ID_CHARS = 128
MAX_EVENT_ID = 2**63 - 1
MIN_EVENT_ID = -(2**63)


class Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True):
    """The base of every client message (a subclass gives ``tag=`` its ``type`` and an ``event_id``)."""


def type_of(msg: Message) -> str:
    """The message's ``type`` (its struct's tag)."""
    return cast(str, msg.__struct_config__.tag)  # a string: MessageTable accepts no other tag


@dataclass(frozen=True)
class Renamed:
    """A message type renamed in this release (module docstring): ``old`` is accepted as ``new``
    (deprecated, for one release); ``answers`` maps the new names of the server events that answer
    it to their old names, sent to a connection that used ``old``."""

    old: str
    new: type[Message]
    answers: Mapping[str, str] = field(default_factory=dict)


class MessageTable:
    """The ``type`` -> struct table of one protocol (module docstring)."""

    def __init__(self, *messages: type[Message], renamed: tuple[Renamed, ...] = (),
                 max_event_id_chars: int = MAX_EVENT_ID_CHARS) -> None:
        tags = [m.__struct_config__.tag for m in messages] + [r.old for r in renamed]
        if not messages or any(not isinstance(t, str) for t in tags) or len(set(tags)) != len(tags):
            raise ValueError(f"a message table needs messages with distinct string tags, got {tags}")
        if any(r.new not in messages for r in renamed):
            raise ValueError("a renamed message's new struct must be in the table")
        self.messages = messages
        self.renamed = renamed
        self.types: tuple[str, ...] = tuple(sorted(cast(list[str], tags[:len(messages)])))  # strings: checked above
        self._accepted = frozenset(cast(list[str], tags))
        # the old name decodes as a subclass of the new struct, converted to the new struct below
        self._old: dict[type, Renamed] = {types.new_class(f"{r.new.__name__}Deprecated", (r.new,), {"tag": r.old}): r
                                          for r in renamed}
        self.max_event_id_chars = max_event_id_chars
        self._decoder = msgspec.json.Decoder(Union[(*messages, *self._old)])  # noqa: UP007

    def decode(self, frame: str | bytes, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> Message:
        """The typed message of one text frame, or ``ProtocolError`` (module docstring)."""
        return self.read(frame, max_bytes, max_depth)[0]

    def read(self, frame: str | bytes, max_bytes: int,
             max_depth: int = MAX_JSON_DEPTH) -> tuple[Message, Renamed | None]:
        """``decode``, and the :class:`Renamed` whose old ``type`` the frame used (``None``: a current one)."""
        raw = frame.encode() if isinstance(frame, str) else frame
        if len(raw) > max_bytes:
            raise ProtocolError("message_too_large", f"a message is at most {max_bytes} bytes, got {len(raw)}")
        depth = too_deep(raw, max_depth)
        if depth is not None:
            raise ProtocolError("invalid_message", depth_message(depth, max_depth))
        try:
            msg = self._decoder.decode(raw)
        except msgspec.DecodeError as exc:
            loose = _loose(raw)
            if not isinstance(loose, dict):
                raise ProtocolError("invalid_message", "a message must be a JSON object with a 'type'") from None
            event_id = self._event_id_of(loose)
            kind = loose.get("type")
            if kind not in self._accepted:
                raise ProtocolError("unknown_type", f"unknown message type {kind!r}; expected one of "
                                    f"{', '.join(self.types)}", event_id) from None
            raise ProtocolError("invalid_message", f"{kind}: {exc}", event_id) from None
        eid = msg.event_id
        if eid is not None and self._event_id_of({"event_id": eid}) is None:
            raise ProtocolError("invalid_message", f"{type_of(msg)}: event_id must be an integer in "
                                f"[-2**63, 2**63-1] or a string of 1-{self.max_event_id_chars} characters")
        old = self._old.get(type(msg))
        if old is None:
            return msg, None
        return old.new(**msgspec.structs.asdict(msg)), old

    def _event_id_of(self, obj: dict[str, Any]) -> EventId:
        """The frame's ``event_id`` if it is within bounds, else ``None``."""
        eid = obj.get("event_id")
        if isinstance(eid, str) and 0 < len(eid) <= self.max_event_id_chars:
            return eid
        if isinstance(eid, int) and not isinstance(eid, bool) and MIN_EVENT_ID <= eid <= MAX_EVENT_ID:
            return eid
        return None


def _loose(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def server_event(event_type: str, event_id: EventId = None, /, **fields: Any) -> dict[str, Any]:
    """A server event: ``type``, the ``event_id`` of the client message it answers (None if none), fields."""
    return {"type": event_type, "event_id": event_id, **fields}
