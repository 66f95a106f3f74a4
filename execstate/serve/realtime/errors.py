"""The one error type of every realtime protocol, and how exceptions become ``error`` events.

A handler refuses a message by raising :class:`ProtocolError` (a code, a message naming the
problem, the ``event_id`` it answers, and the error ``kind``), or by letting an error of the layer
below escape. ``error_of`` maps what escaped, once for all protocols:

- ``ProtocolError``: as is (its own ``event_id``: a handler may answer for an id inside the message);
- the protocol's own :class:`ErrorRule`\\ s, in order (an agent's ``LedgerError`` codes, say);
- any other ``CodedError`` (``execstate/errors.py``: the session runtime's refusals ``invalid``,
  ``busy``, ``capacity``..., the agent's): its code and message, for the message's ``event_id``;
- ``EngineDeadError``: ``engine_dead`` (kind ``server_error``);
- anything else is a bug: ``None`` here; the connection logs it and answers ``server_error``
  (``internal_error``), and the connection and the server go on.

How an error looks on the wire is the protocol's (``RealtimeProtocol.error_event``): by default
OpenAI Realtime's shape (:func:`error_event`); the world protocol uses vLLM-Omni's flat shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from execstate.engine.async_engine import EngineDeadError
from execstate.errors import CodedError

EventId = int | str | None
"""A client message's ``event_id`` as the server echoes it (``None``: absent or unreadable)."""

INVALID = "invalid_request_error"
SERVER_ERROR = "server_error"


class ProtocolError(Exception):
    """A client message the server does not act on; answered with an ``error`` event."""

    def __init__(self, code: str, message: str, event_id: EventId = None, kind: str = INVALID) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id
        self.kind = kind


@dataclass(frozen=True)
class ErrorRule:
    """Exceptions of ``exc_type`` escaping a handler are answered as ``to_error(exc, event_id)``."""

    exc_type: type[Exception]
    to_error: Callable[[Any, EventId], ProtocolError]


def _coded_error(e: CodedError, event_id: EventId) -> ProtocolError:
    return ProtocolError(e.code, e.message, event_id)


def _engine_dead(e: EngineDeadError, event_id: EventId) -> ProtocolError:
    return ProtocolError("engine_dead", f"the engine is not serving: {e}", event_id, SERVER_ERROR)


RUNTIME_ERRORS = (ErrorRule(CodedError, _coded_error), ErrorRule(EngineDeadError, _engine_dead))


def error_of(exc: Exception, event_id: EventId, rules: tuple[ErrorRule, ...] = ()) -> ProtocolError | None:
    """The ``ProtocolError`` that answers ``exc`` (module docstring); ``None`` for a bug."""
    if isinstance(exc, ProtocolError):
        return exc
    for rule in (*rules, *RUNTIME_ERRORS):
        if isinstance(exc, rule.exc_type):
            return rule.to_error(exc, event_id)
    return None


def internal_error(exc: BaseException, event_id: EventId) -> ProtocolError:
    return ProtocolError("server_error", f"internal error: {exc!r}", event_id, SERVER_ERROR)


def error_event(code: str, message: str, event_id: EventId = None, kind: str = INVALID,
                param: str | None = None) -> dict[str, Any]:
    """An ``error`` event in OpenAI Realtime's shape: ``type``, ``event_id``, ``error``."""
    err: dict[str, Any] = {"type": kind, "code": code, "message": message}
    if param is not None:
        err["param"] = param
    return {"type": "error", "event_id": event_id, "error": err}


def openai_error_shape(err: ProtocolError, values: Mapping[str, Any]) -> dict[str, Any]:
    """The default ``RealtimeProtocol.error_event``: :func:`error_event` (the connection's values unused)."""
    return error_event(err.code, err.message, err.event_id, err.kind)
