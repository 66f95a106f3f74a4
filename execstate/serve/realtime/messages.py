"""Client messages and their registry: one JSON object per text frame, its ``type`` picks the struct.

A protocol declares each client message as a :class:`Message` subclass whose ``tag`` is its
``type`` and which has an ``event_id`` field (the id the server echoes in the answer and in every
``error`` it causes), and lists them in a :class:`MessageTable`::

    class Ping(Message, tag="ping"):
        event_id: EventId = None

    MESSAGES = MessageTable(Ping, Pong)

``MessageTable.decode`` turns a frame into the typed message or raises ``ProtocolError``:
``message_too_large`` (over the protocol's bound), ``unknown_type`` (a ``type`` not in
``types``) or ``invalid_message`` naming the problem, with the frame's ``event_id`` when it could
be read. Unknown fields are refused (``forbid_unknown_fields``). With ``max_event_id_chars``, a
string ``event_id`` must have 1 to that many characters (else ``invalid_message``).

Server events are plain dicts (``server_event``), written as JSON text frames in order.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from execstate.serve.realtime.errors import EventId, ProtocolError


class Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True):
    """The base of every client message (a subclass gives ``tag=`` its ``type`` and an ``event_id``)."""


def type_of(msg: Message) -> str:
    """The message's ``type`` (its struct's tag)."""
    return msg.__struct_config__.tag  # type: ignore[return-value]


class MessageTable:
    """The ``type`` -> struct table of one protocol (module docstring)."""

    def __init__(self, *messages: type[Message], max_event_id_chars: int | None = None) -> None:
        tags = [m.__struct_config__.tag for m in messages]
        if not messages or any(not isinstance(t, str) for t in tags) or len(set(tags)) != len(tags):
            raise ValueError(f"a message table needs messages with distinct string tags, got {tags}")
        self.messages = messages
        self.types: tuple[str, ...] = tuple(sorted(tags))  # type: ignore[arg-type]
        self.max_event_id_chars = max_event_id_chars
        self._decoder = msgspec.json.Decoder(Union[messages])  # type: ignore[valid-type]  # noqa: UP007

    def decode(self, frame: str | bytes, max_bytes: int) -> Message:
        """The typed message of one text frame, or ``ProtocolError`` (module docstring)."""
        raw = frame.encode() if isinstance(frame, str) else frame
        if len(raw) > max_bytes:
            raise ProtocolError("message_too_large", f"a message is at most {max_bytes} bytes, got {len(raw)}")
        try:
            msg = self._decoder.decode(raw)
        except msgspec.DecodeError as exc:
            loose = _loose(raw)
            if not isinstance(loose, dict):
                raise ProtocolError("invalid_message", "a message must be a JSON object with a 'type'") from None
            event_id = self._event_id_of(loose)
            kind = loose.get("type")
            if kind not in self.types:
                raise ProtocolError("unknown_type", f"unknown message type {kind!r}; expected one of "
                                    f"{', '.join(self.types)}", event_id) from None
            raise ProtocolError("invalid_message", f"{kind}: {exc}", event_id) from None
        limit = self.max_event_id_chars
        eid = msg.event_id  # type: ignore[attr-defined]
        if limit is not None and (isinstance(eid, bool) or (isinstance(eid, str) and not 0 < len(eid) <= limit)):
            raise ProtocolError("invalid_message", f"event_id must be an integer or a string of 1-{limit} characters")
        return msg

    def _event_id_of(self, obj: dict[str, Any]) -> EventId:
        eid = obj.get("event_id")
        limit = self.max_event_id_chars
        if isinstance(eid, str) and (limit is None or 0 < len(eid) <= limit):
            return eid
        if isinstance(eid, int) and not isinstance(eid, bool):
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
