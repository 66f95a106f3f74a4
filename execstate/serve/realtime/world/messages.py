"""Messages of the world-session WebSocket (``/v1/realtime/video``; docs/world-serving.md).

vLLM-Omni's realtime video protocol, spoken as is where it fits, with a few extensions for a
steerable world (held keys, pause, checkpoints). One JSON object per text frame from the client;
the server answers with JSON text frames and, for every chunk, one binary frame right after the
chunk's ``video.chunk_metadata``.

Client -> server (every message may carry ``event_id``, a string or an integer, echoed by the
``error`` it causes):

==========================  ====================================================================
``session.create``          ``prompt``, ``seed``, ``fps`` (0: as fast as possible), ``format``
                            (``png`` | ``rgb``), ``start`` (``render`` | ``generate``), ``num_frames``
                            (stop after), ``window_chunks``; vLLM-Omni's ``model``, ``width``,
                            ``height``, ``num_inference_steps``, ``guidance_scale``, ``negative_prompt``,
                            ``extra_params`` are checked; answered with ``video.start``
``session.interaction``     ``interaction: {event_id?, event: {prompt?, multi_modal_data?:
                            {action?, camera?}}, transition_chunks?}`` (vLLM-Omni's shape)
``key.down`` / ``key.up``   ``key`` (a key name of the model, e.g. ``up``): a held key (extension)
``session.pause`` / ``session.unpause``   stop / restart stepping (extension)
``session.checkpoint`` / ``session.rollback`` (``checkpoint_id``) / ``checkpoint.release``
``session.ping``            answered with ``session.pong``
``session.close``           answered with ``session.closed`` (``stopped: true``)
==========================  ====================================================================

Deprecated names, accepted for one release (``RENAMED``; the realtime vocabulary is one across the
LM, world, agent and voice sockets): ``session.start`` (now ``session.create``), ``session.stop``
(``session.close``), ``session.resume`` (``session.unpause``: on ``/v1/realtime`` it reattaches a
session). A connection that sends one of them gets the old answers too: ``session.done`` for
``session.closed``, ``session.resumed`` for ``session.unpaused``.

Each message is a struct below (listed in ``MESSAGES``); ``PHASES`` says which a connection acts
on when; ``WORLD_PROTOCOL`` puts them together for the framework (``serve/realtime/``), which
answers malformed frames (``invalid_message``, ``unknown_type``, ``message_too_large``). Errors
have vLLM-Omni's flat shape (:func:`error_event`: ``code`` and ``message`` at the top, with the
session's ``request_id``). The handlers are ``handlers.py``.

Limits: a text frame over 64 KiB is ``message_too_large``; more than 256 messages not yet
processed: ``too_many_messages``, then close code 1008; more than 64 items (events, chunks) not yet
written: the session's stepper waits, so a client that does not read only slows its own session.

Phases (a connection runs at most one world session at a time)::

    NO_SESSION --video.start--> RUNNING --session.paused--> PAUSED --session.unpaused--> RUNNING
    RUNNING | PAUSED --session.closed (session.close, num_frames reached, step failed)--> NO_SESSION
    any --disconnect--> GONE

Refusals (an ``error`` event; the connection stays open): ``no_session`` (anything but
``session.create`` / ``session.ping`` while no session runs), ``session_exists`` (``session.create``
while one runs: ``session.close`` it first), ``already_paused`` / ``not_paused`` (``session.pause``
while paused, ``session.unpause`` while running), ``connection_closed`` (once the socket is gone).
Every other message is acted on while a session runs or is paused (events queue for the next chunk
boundary either way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from execstate.serve.realtime.checkpoint_messages import CheckpointRelease, SessionCheckpoint, SessionRollback
from execstate.serve.realtime.errors import EventId, ProtocolError
from execstate.serve.realtime.limits import Limits
from execstate.serve.realtime.messages import Message, MessageTable, Renamed
from execstate.serve.realtime.phases import Move, Phase, PhaseTable, Refusal
from execstate.serve.realtime.protocol import RealtimeProtocol

MAX_MESSAGE_BYTES = 64 << 10  # control messages are small; a prompt is at most MAX_PROMPT_CHARS
MAX_UNSENT = 64
MAX_PROMPT_CHARS = 2000


class SessionCreate(Message, tag="session.create"):
    prompt: str = ""
    seed: int = 0
    fps: float | None = None  # None: the server's default; 0: as fast as possible
    format: Literal["png", "rgb"] = "png"
    start: Literal["render", "generate"] = "render"
    num_frames: int | None = None  # stop (session.closed) after this many frames
    window_chunks: int | None = None
    model: str | None = None
    width: int | None = None
    height: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    extra_params: dict[str, Any] | None = None
    event_id: EventId = None


class Interaction(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    event: dict[str, Any]
    event_id: str | None = None
    interaction_id: str | None = None  # vLLM-Omni's design name for event_id
    transition_chunks: int | None = None


class SessionInteraction(Message, tag="session.interaction"):
    interaction: Interaction
    event_id: EventId = None


class KeyDown(Message, tag="key.down"):
    key: str
    event_id: EventId = None


class KeyUp(Message, tag="key.up"):
    key: str
    event_id: EventId = None


class SessionPause(Message, tag="session.pause"):
    event_id: EventId = None


class SessionUnpause(Message, tag="session.unpause"):
    event_id: EventId = None


class SessionPing(Message, tag="session.ping"):
    event_id: EventId = None


class SessionClose(Message, tag="session.close"):
    event_id: EventId = None


CLOSED_AS_DONE = {"session.closed": "session.done"}
RENAMED = (
    Renamed("session.start", SessionCreate, CLOSED_AS_DONE),
    Renamed("session.stop", SessionClose, CLOSED_AS_DONE),
    Renamed("session.resume", SessionUnpause, {"session.unpaused": "session.resumed"}),
)
"""The world's former names (module docstring), accepted for one release."""

MESSAGES = MessageTable(
    SessionCreate, SessionInteraction, KeyDown, KeyUp, SessionPause, SessionUnpause, SessionCheckpoint,
    SessionRollback, CheckpointRelease, SessionPing, SessionClose, renamed=RENAMED,
)

SESSION_EXISTS = Refusal("session_exists", "session {request_id} is running on this connection; send session.close "
                         "first")
NO_SESSION = Phase("no_session", allow=frozenset({"session.create", "session.ping"}), otherwise=Refusal(
    "no_session", "{type}: no world session on this connection; send session.create first"))
RUNNING = Phase("running", refuse={"session.create": SESSION_EXISTS,
                                   "session.unpause": Refusal("not_paused", "the session is not paused")})
PAUSED = Phase("paused", refuse={"session.create": SESSION_EXISTS,
                                 "session.pause": Refusal("already_paused", "the session is already paused")})
START = Move("start", frozenset({NO_SESSION}), RUNNING, strict=True)  # video.start
PAUSE = Move("pause", frozenset({RUNNING}), PAUSED, strict=True)  # session.paused
UNPAUSE = Move("unpause", frozenset({PAUSED}), RUNNING, strict=True)  # session.unpaused
CLOSE = Move("close", None, NO_SESSION)  # session.closed
PHASES = PhaseTable(NO_SESSION, (NO_SESSION, RUNNING, PAUSED), (START, PAUSE, UNPAUSE, CLOSE), values=("request_id",))


def error_event(code: str, message: str, event_id: EventId = None, request_id: str | None = None) -> dict[str, Any]:
    """The server's ``error`` (vLLM-Omni's flat shape: ``code`` and ``message`` at the top)."""
    return {"type": "error", "request_id": request_id, "event_id": event_id, "code": code, "message": message}


def _error_shape(err: ProtocolError, values: Mapping[str, Any]) -> dict[str, Any]:
    return error_event(err.code, err.message, err.event_id, values.get("request_id"))


WORLD_PROTOCOL = RealtimeProtocol(
    "world", MESSAGES, PHASES,
    Limits(max_message_bytes=MAX_MESSAGE_BYTES, max_unprocessed_bytes=None, max_unsent_events=MAX_UNSENT),
    error_event=_error_shape,
)
