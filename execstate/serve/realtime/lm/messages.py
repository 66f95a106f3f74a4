"""Messages of the realtime WebSocket (``/v1/realtime``): one JSON object per text frame.

The protocol mirrors the offline session API one to one, with event names in the style of the
OpenAI Realtime API. Every client message has a ``type`` and may carry an ``event_id`` that the
server echoes in the ``error`` it causes (for ``event.submit`` the ``event_id`` is required and
is the session event id: a non-negative int, strictly increasing per session).

Client -> server (each answered as ``docs/realtime.md`` says: an acknowledgement, a response, or
an ``error``):

============================  ======================================================================
``session.create``            open a session: ``session: {id?, sampling?, max_tokens?, return_routes?,
                              priority?, cache_salt?}``
``session.resume``            reattach to a session no live connection holds: ``session_id``
``session.get``               the session's info, context token ids (and route rows when asked)
``event.submit``              queue an event: ``event_id``, ``kind``, ``data`` (applied at the next step)
``response.create``           step: ``input?`` ({"token_ids": [...]} or {"text": ...}), ``max_tokens?``,
                              ``return_routes?``, ``reprefill?``
``response.cancel``           stop the step in progress (its ``response.done`` says ``cancelled``)
``session.checkpoint``        pin the session's state now; answered with ``session.checkpointed``
``session.rollback``          back to ``checkpoint_id``; answered with ``session.rolled_back``
``session.reset``             back to the newest checkpoint (the way out of FAILED); ``session.reset_done``
``checkpoint.release``        release ``checkpoint_id``; ``checkpoint.released``
``session.fork``              a new session from ``checkpoint_id`` (or now); ``session.forked``
``session.close``             release everything; ``session.closed``
============================  ======================================================================

Server -> client: ``session.created``, ``session.resumed``, ``session.info``, ``event.accepted``,
``response.created``, ``response.delta`` (new token ids and text), ``response.done`` (the step's
metadata; its route rows as base64 ``.npy`` when asked), ``session.checkpointed``,
``session.rolled_back``, ``session.reset_done``, ``checkpoint.released``, ``session.forked``,
``session.closed``, and ``error``
(``{"type": "error", "event_id": <the offending message's>, "error": {"type", "code", "message"}}``).

``parse_client_message`` turns a frame into a typed message or raises :class:`ProtocolError`
(code ``invalid_message``, ``unknown_type`` or ``message_too_large``) that still knows the frame's
``event_id`` when it could be read, so no malformed message is dropped silently.
"""

from __future__ import annotations

from typing import Any

import msgspec

MAX_MESSAGE_BYTES = 1 << 20  # one frame; a session's input beyond this is split into several events

ClientEventId = int | str | None


class ProtocolError(Exception):
    """A frame the server cannot act on; sent back as an ``error`` event."""

    def __init__(self, code: str, message: str, event_id: ClientEventId = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id


class _Msg(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True):
    pass


class SessionConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``session.create``'s ``session``: a client-chosen id (else generated), sampling fields with
    vLLM's names (temperature, top_p, top_k, min_p, seed, penalties, stop...), the default
    ``max_tokens`` of a step, whether ``response.done`` carries the step's route rows, the
    scheduling class (``priority``: 1 interactive, the default; 0 batch) and the tenant
    ``cache_salt`` (as the HTTP API's)."""

    id: str | None = None
    sampling: dict[str, Any] = msgspec.field(default_factory=dict)
    max_tokens: int | None = None
    return_routes: bool = False
    priority: int | None = None
    cache_salt: str | None = None


class SessionCreate(_Msg, tag="session.create"):
    session: SessionConfig = msgspec.field(default_factory=SessionConfig)
    event_id: int | str | None = None


class SessionResume(_Msg, tag="session.resume"):
    session_id: str
    event_id: int | str | None = None


class SessionGet(_Msg, tag="session.get"):
    event_id: int | str | None = None


class EventSubmit(_Msg, tag="event.submit"):
    event_id: int
    kind: str
    data: Any = None


class ResponseCreate(_Msg, tag="response.create"):
    input: dict[str, Any] | None = None
    max_tokens: int | None = None
    return_routes: bool | None = None
    reprefill: bool = False
    event_id: int | str | None = None


class ResponseCancel(_Msg, tag="response.cancel"):
    event_id: int | str | None = None


class SessionCheckpoint(_Msg, tag="session.checkpoint"):
    event_id: int | str | None = None


class SessionRollback(_Msg, tag="session.rollback"):
    checkpoint_id: str
    event_id: int | str | None = None


class SessionReset(_Msg, tag="session.reset"):
    event_id: int | str | None = None


class CheckpointRelease(_Msg, tag="checkpoint.release"):
    checkpoint_id: str
    event_id: int | str | None = None


class SessionFork(_Msg, tag="session.fork"):
    checkpoint_id: str | None = None
    session_id: str | None = None  # the new session's id (else generated)
    event_id: int | str | None = None


class SessionClose(_Msg, tag="session.close"):
    event_id: int | str | None = None


ClientMessage = (
    SessionCreate | SessionResume | SessionGet | EventSubmit | ResponseCreate | ResponseCancel | SessionCheckpoint
    | SessionRollback | SessionReset | CheckpointRelease | SessionFork | SessionClose
)
CLIENT_TYPES = tuple(sorted(t.__struct_config__.tag for t in ClientMessage.__args__))  # type: ignore[attr-defined]
_DECODER = msgspec.json.Decoder(ClientMessage)


def parse_client_message(frame: str | bytes) -> ClientMessage:
    """A typed client message, or ``ProtocolError`` naming what is wrong (and the frame's
    ``event_id`` when it could be read)."""
    return decode_client_message(_DECODER, CLIENT_TYPES, frame)


def decode_client_message(decoder: msgspec.json.Decoder, client_types: tuple[str, ...], frame: str | bytes,
                          max_bytes: int = MAX_MESSAGE_BYTES, max_event_id_chars: int | None = None) -> Any:
    """One JSON text frame decoded into a protocol's tagged union (``decoder``), or ``ProtocolError``:
    ``message_too_large`` (over ``max_bytes``), ``unknown_type`` (a ``type`` not in ``client_types``)
    or ``invalid_message`` naming the problem, with the frame's ``event_id`` when it could be read
    (an int, or a string of at most ``max_event_id_chars`` when that is given). Shared by every
    WebSocket protocol of the server (LM sessions, agents, world sessions)."""
    raw = frame.encode() if isinstance(frame, str) else frame
    if len(raw) > max_bytes:
        raise ProtocolError("message_too_large", f"a message is at most {max_bytes} bytes, got {len(raw)}")
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:
        loose = _loose(raw)
        if not isinstance(loose, dict):
            raise ProtocolError("invalid_message", "a message must be a JSON object with a 'type'") from None
        event_id = _event_id_of(loose, max_event_id_chars)
        kind = loose.get("type")
        if kind not in client_types:
            raise ProtocolError(
                "unknown_type", f"unknown message type {kind!r}; expected one of {', '.join(client_types)}", event_id
            ) from None
        raise ProtocolError("invalid_message", f"{kind}: {exc}", event_id) from None


def _loose(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def _event_id_of(obj: dict[str, Any], max_chars: int | None = None) -> ClientEventId:
    eid = obj.get("event_id")
    if isinstance(eid, str) and (max_chars is None or 0 < len(eid) <= max_chars):
        return eid
    if isinstance(eid, int) and not isinstance(eid, bool):
        return eid
    return None


def error_event(code: str, message: str, event_id: ClientEventId = None, kind: str = "invalid_request_error",
                param: str | None = None) -> dict[str, Any]:
    """The server's ``error`` event (OpenAI Realtime shape: ``type``, ``event_id``, ``error``)."""
    err: dict[str, Any] = {"type": kind, "code": code, "message": message}
    if param is not None:
        err["param"] = param
    return {"type": "error", "event_id": event_id, "error": err}


def type_of(msg: ClientMessage) -> str:
    """The message's ``type`` (its tag)."""
    return msg.__struct_config__.tag  # type: ignore[return-value]
