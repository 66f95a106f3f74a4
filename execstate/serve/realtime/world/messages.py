"""Messages of the world-session WebSocket (``/v1/realtime/video``; docs/world-serving.md).

vLLM-Omni's realtime video protocol, spoken as is where it fits, with a few extensions for a
steerable world (held keys, pause, checkpoints). One JSON object per text frame from the client;
the server answers with JSON text frames and, for every chunk, one binary frame right after the
chunk's ``video.chunk_metadata``.

Client -> server (every message may carry ``event_id``, a string or an integer, echoed by the
``error`` it causes):

==========================  ====================================================================
``session.start``           ``prompt``, ``seed``, ``fps`` (0: as fast as possible), ``format``
                            (``png`` | ``rgb``), ``start`` (``render`` | ``generate``), ``num_frames``
                            (stop after), ``window_chunks``; vLLM-Omni's ``model``, ``width``,
                            ``height``, ``num_inference_steps``, ``guidance_scale``, ``negative_prompt``,
                            ``extra_params`` are checked
``session.interaction``     ``interaction: {event_id?, event: {prompt?, multi_modal_data?:
                            {action?, camera?}}, transition_chunks?}`` (vLLM-Omni's shape)
``key.down`` / ``key.up``   ``key`` (a key name of the model, e.g. ``up``): a held key (extension)
``session.pause`` / ``session.resume``   stop / restart stepping (extension)
``session.checkpoint`` / ``session.rollback`` (``checkpoint_id``) / ``checkpoint.release``
``session.ping``            answered with ``session.pong``
``session.stop``            answered with ``session.done`` (``stopped: true``)
==========================  ====================================================================

``parse_client_message`` turns a frame into a typed message or raises :class:`WorldProtocolError`
(``invalid_message``, ``unknown_type``, ``message_too_large``) that still knows the frame's
``event_id`` when it could be read.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from execstate.serve.realtime_protocol import ClientEventId, ProtocolError, decode_client_message

MAX_MESSAGE_BYTES = 64 << 10  # control messages are small; a prompt is at most MAX_PROMPT_CHARS
MAX_PROMPT_CHARS = 2000
MAX_EVENT_ID_CHARS = 128

# The world protocol's errors are the realtime protocol's (code, message, event_id).
WorldProtocolError = ProtocolError


class _Msg(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True):
    pass


class SessionStart(_Msg, tag="session.start"):
    prompt: str = ""
    seed: int = 0
    fps: float | None = None  # None: the server's default; 0: as fast as possible
    format: Literal["png", "rgb"] = "png"
    start: Literal["render", "generate"] = "render"
    num_frames: int | None = None  # stop (session.done) after this many frames
    window_chunks: int | None = None
    model: str | None = None
    width: int | None = None
    height: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    extra_params: dict[str, Any] | None = None
    event_id: int | str | None = None


class Interaction(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    event: dict[str, Any]
    event_id: str | None = None
    interaction_id: str | None = None  # vLLM-Omni's design name for event_id
    transition_chunks: int | None = None


class SessionInteraction(_Msg, tag="session.interaction"):
    interaction: Interaction
    event_id: int | str | None = None


class KeyDown(_Msg, tag="key.down"):
    key: str
    event_id: int | str | None = None


class KeyUp(_Msg, tag="key.up"):
    key: str
    event_id: int | str | None = None


class SessionPause(_Msg, tag="session.pause"):
    event_id: int | str | None = None


class SessionResume(_Msg, tag="session.resume"):
    event_id: int | str | None = None


class SessionCheckpoint(_Msg, tag="session.checkpoint"):
    event_id: int | str | None = None


class SessionRollback(_Msg, tag="session.rollback"):
    checkpoint_id: str
    event_id: int | str | None = None


class CheckpointRelease(_Msg, tag="checkpoint.release"):
    checkpoint_id: str
    event_id: int | str | None = None


class SessionPing(_Msg, tag="session.ping"):
    event_id: int | str | None = None


class SessionStop(_Msg, tag="session.stop"):
    event_id: int | str | None = None


ClientMessage = (
    SessionStart | SessionInteraction | KeyDown | KeyUp | SessionPause | SessionResume | SessionCheckpoint
    | SessionRollback | CheckpointRelease | SessionPing | SessionStop
)
CLIENT_TYPES = tuple(sorted(t.__struct_config__.tag for t in ClientMessage.__args__))  # type: ignore[attr-defined]
_DECODER = msgspec.json.Decoder(ClientMessage)


def parse_client_message(frame: str | bytes) -> ClientMessage:
    """A typed client message, or ``WorldProtocolError`` naming what is wrong."""
    msg = decode_client_message(_DECODER, CLIENT_TYPES, frame, MAX_MESSAGE_BYTES, MAX_EVENT_ID_CHARS)
    eid = msg.event_id
    if isinstance(eid, bool) or (isinstance(eid, str) and not 0 < len(eid) <= MAX_EVENT_ID_CHARS):
        raise WorldProtocolError("invalid_message", f"event_id must be an integer or a string of 1-{MAX_EVENT_ID_CHARS}"
                                 " characters", None)
    return msg


def type_of(msg: ClientMessage) -> str:
    return msg.__struct_config__.tag  # type: ignore[return-value]


def error_event(code: str, message: str, event_id: ClientEventId = None, request_id: str | None = None) -> dict[str, Any]:
    """The server's ``error`` (vLLM-Omni's flat shape: ``code`` and ``message`` at the top)."""
    return {"type": "error", "request_id": request_id, "event_id": event_id, "code": code, "message": message}
