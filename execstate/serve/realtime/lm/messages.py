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

Each message is a struct below (listed in ``MESSAGES``); which of them a connection acts on in
which phase is ``PHASES``; ``LM_PROTOCOL`` puts them together for the framework
(``serve/realtime/``), which answers malformed frames (``invalid_message``, ``unknown_type``,
``message_too_large``), keeps the phases and maps errors. The handlers are ``handlers.py``.

Phases (a connection drives at most one session at a time, its *attached* session, and runs at
most one response, a step, at a time)::

    NO_SESSION --session.created / session.resumed--> READY
    READY --response.created--> RESPONDING --response.done--> READY
    READY | RESPONDING --session.closed--> NO_SESSION
    any --disconnect--> GONE

Refusals (an ``error`` event; the connection stays open): ``no_session`` (anything but
``session.create`` / ``session.resume`` while no session is attached), ``session_exists``
(``session.create`` / ``session.resume`` while one is attached: close it first),
``response_in_progress`` (while a response runs, only ``event.submit``, queued for the next step,
``response.cancel``, ``session.get`` and ``session.close``, which cancels the response, are acted
on), ``no_response`` (``response.cancel`` with no response in progress, including one that has
already sent its ``response.done``), ``connection_closed`` (after the socket went).
"""

from __future__ import annotations

from typing import Any

import msgspec

from execstate.serve.realtime.checkpoint_messages import CheckpointRelease, SessionCheckpoint, SessionRollback
from execstate.serve.realtime.errors import EventId
from execstate.serve.realtime.messages import Message, MessageTable
from execstate.serve.realtime.phases import Move, Phase, PhaseTable, Refusal
from execstate.serve.realtime.protocol import RealtimeProtocol


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


class SessionCreate(Message, tag="session.create"):
    session: SessionConfig = msgspec.field(default_factory=SessionConfig)
    event_id: EventId = None


class SessionResume(Message, tag="session.resume"):
    session_id: str
    event_id: EventId = None


class SessionGet(Message, tag="session.get"):
    event_id: EventId = None


class EventSubmit(Message, tag="event.submit"):
    event_id: int
    kind: str
    data: Any = None


class ResponseCreate(Message, tag="response.create"):
    input: dict[str, Any] | None = None
    max_tokens: int | None = None
    return_routes: bool | None = None
    reprefill: bool = False
    event_id: EventId = None


class ResponseCancel(Message, tag="response.cancel"):
    event_id: EventId = None


class SessionReset(Message, tag="session.reset"):
    event_id: EventId = None


class SessionFork(Message, tag="session.fork"):
    checkpoint_id: str | None = None
    session_id: str | None = None  # the new session's id (else generated)
    event_id: EventId = None


class SessionClose(Message, tag="session.close"):
    event_id: EventId = None


MESSAGES = MessageTable(
    SessionCreate, SessionResume, SessionGet, EventSubmit, ResponseCreate, ResponseCancel, SessionCheckpoint,
    SessionRollback, SessionReset, CheckpointRelease, SessionFork, SessionClose,
)

OPENING = frozenset({"session.create", "session.resume"})
WHILE_RESPONDING = frozenset({"event.submit", "response.cancel", "session.get", "session.close"})
SESSION_EXISTS = Refusal("session_exists", "{type}: this connection already has session {session_id!r}; send "
                         "session.close first")
NO_SESSION = Phase("no_session", allow=OPENING, otherwise=Refusal(
    "no_session", "{type}: no session on this connection; send session.create or session.resume first"))
READY = Phase("ready", refuse={**dict.fromkeys(OPENING, SESSION_EXISTS), "response.cancel": Refusal(
    "no_response", "response.cancel: no response is in progress")})
RESPONDING = Phase("responding", refuse=dict.fromkeys(OPENING, SESSION_EXISTS), allow=WHILE_RESPONDING,
                   otherwise=Refusal("response_in_progress", "{type}: response {response_id!r} is in progress; wait "
                                     "for its response.done or send response.cancel"))
ATTACH = Move("attach", frozenset({NO_SESSION}), READY, strict=True)  # session.created / session.resumed
BEGIN_RESPONSE = Move("begin_response", frozenset({READY}), RESPONDING, strict=True)  # response.created
END_RESPONSE = Move("end_response", frozenset({RESPONDING}), READY)  # response.done sent
DETACH = Move("detach", None, NO_SESSION)  # session.closed
PHASES = PhaseTable(NO_SESSION, (NO_SESSION, READY, RESPONDING), (ATTACH, BEGIN_RESPONSE, END_RESPONSE, DETACH),
                    values=("session_id", "response_id"))

LM_PROTOCOL = RealtimeProtocol("realtime", MESSAGES, PHASES)
