"""What defines one realtime protocol: its messages, its phases, its limits and its error shape.

A :class:`RealtimeProtocol` is a plain value, written next to the protocol's message structs
(``<protocol>/messages.py``); the framework (``connection.py``, ``endpoint.py``) does the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from execstate.serve.realtime.errors import ErrorRule, EventId, ProtocolError, error_of, openai_error_shape
from execstate.serve.realtime.limits import Limits
from execstate.serve.realtime.messages import Message, MessageTable, Renamed
from execstate.serve.realtime.phases import PhaseTable

SUBPROTOCOL = "realtime"

ErrorShape = Callable[[ProtocolError, Mapping[str, Any]], dict[str, Any]]
"""An ``error`` event from the error and the connection's phase values (``{}`` for an error of the
transport, about no session: ``too_many_messages``)."""


@dataclass(frozen=True)
class RealtimeProtocol:
    """``name`` (in logs), ``messages`` (the type -> struct table), ``phases`` (which types each
    phase acts on), ``limits``, ``errors`` (the protocol's own exception rules, before the
    framework's: ``errors.py``), ``error_event`` (the wire shape of an error) and ``subprotocol``
    (selected when the client offers it: browsers offer it next to their API key)."""

    name: str
    messages: MessageTable
    phases: PhaseTable
    limits: Limits = field(default_factory=Limits)
    errors: tuple[ErrorRule, ...] = ()
    error_event: ErrorShape = openai_error_shape
    subprotocol: str = SUBPROTOCOL

    def parse(self, frame: str | bytes) -> Message:
        """A typed client message, or ``ProtocolError`` (``messages.py``)."""
        return self.read(frame)[0]

    def read(self, frame: str | bytes) -> tuple[Message, Renamed | None]:
        """``parse``, and the :class:`Renamed` whose deprecated ``type`` the frame used, if any."""
        return self.messages.read(frame, self.limits.max_message_bytes, self.limits.max_json_depth)

    def error_of(self, exc: Exception, event_id: EventId) -> ProtocolError | None:
        return error_of(exc, event_id, self.errors)
