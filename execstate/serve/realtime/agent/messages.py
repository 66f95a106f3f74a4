"""Messages of the agent WebSocket (``/v1/realtime/agent``): one JSON object per text frame.

The events follow the OpenAI Realtime / GPT-Live shape where one fits (docs/agent-protocol.md has
every field and the mapping). Every client message has a ``type`` and may carry an ``event_id``
(a string or an integer) that the server echoes in the answer it causes, and in every ``error``.

Client -> server:

===============================  ====================================================================
``session.create``               open the agent: ``session`` (:class:`AgentSessionConfig`)
``session.update``               change the live settings (turn, delegation, response sizes, ...)
``session.close``                close the agent: ``cancel_tasks?`` (default true)
``input_text.append``            a timed chunk of user input: ``text``, ``t?`` (agent clock, s)
``response.cancel``              cancel the response in flight: ``cancel_tasks?`` (default false)
``conversation.item.truncate``   cut a reply to what was played: ``item_id``, ``audio_end_ms`` or
                                 ``played_chars``
``delegation.cancel``            cancel one back-end task: ``delegation_id``
``delegation.result.submit``     a client-run tool's result: ``delegation_id``, ``output``
``conversation.item.create``     the OpenAI alias of the above: ``item`` {type: function_call_output,
                                 call_id, output}
===============================  ====================================================================

``parse_client_message`` returns a typed message or raises ``ProtocolError`` (codes
``invalid_message``, ``unknown_type``, ``message_too_large``) that still carries the frame's
``event_id`` when it could be read.
"""

from __future__ import annotations

from typing import Any

import msgspec

from execstate.serve.realtime_protocol import decode_client_message

EventId = int | str | None


class _Msg(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True):
    pass


class _Obj(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class TurnSettings(_Obj):
    """``agent/turn_policy.py``'s ``TurnConfig``; absent fields keep their defaults (or current
    values). ``final_silence_s`` may be null: no shortcut after a chunk that ends a sentence."""

    end_of_turn_silence_s: float | msgspec.UnsetType = msgspec.UNSET
    backchannel_max_words: int | msgspec.UnsetType = msgspec.UNSET
    resume_after_s: float | msgspec.UnsetType = msgspec.UNSET
    pause_on_speech: bool | msgspec.UnsetType = msgspec.UNSET
    final_silence_s: float | None | msgspec.UnsetType = msgspec.UNSET


class RuleSettings(_Obj):
    """A delegation rule: ``pattern`` (a regex, case-insensitive) on a finished user turn starts
    ``tool`` with the regex's named groups (over the fixed ``arguments``); ``ack`` is spoken meanwhile."""

    pattern: str
    tool: str
    ack: str | None = None
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class DelegationSettings(_Obj):
    rules: list[RuleSettings] = msgspec.field(default_factory=list)
    ack: str | None = None  # the default acknowledgement


class ClientTool(_Obj):
    """A tool the client runs: its delegations are sent to the client (``delegation.created``,
    ``runner: "client"``), which answers with ``delegation.result.submit``."""

    name: str
    description: str = ""


class AgentSessionConfig(_Obj):
    """``session.create``'s (and ``session.update``'s) ``session``. Fixed at creation:
    ``instructions``, ``sampling``, ``tools``, ``client_tools``; the rest can be updated."""

    instructions: str | None = None  # the front's system prompt
    sampling: dict[str, Any] | None = None  # temperature, top_p, top_k, min_p, seed
    tools: list[str] | None = None  # server tools to enable (None: every registered one)
    client_tools: list[ClientTool] | None = None
    turn: TurnSettings | None = None
    delegation: DelegationSettings | None = None
    step_tokens: int | None = None
    max_response_tokens: int | None = None
    speak_results: str | None = None  # "template" | "model"
    result_template: str | None = None
    model_tool_calls: bool | None = None
    cancel_tasks_on_barge_in: bool | None = None
    chars_per_s: float | None = None  # the playback rate audio_end_ms converts with
    keep_tasks_on_disconnect: bool | None = None  # default false: a disconnect cancels back-end tasks


FIXED_FIELDS = ("instructions", "sampling", "tools", "client_tools")


class SessionCreate(_Msg, tag="session.create"):
    session: AgentSessionConfig = msgspec.field(default_factory=AgentSessionConfig)
    event_id: EventId = None


class SessionUpdate(_Msg, tag="session.update"):
    session: AgentSessionConfig
    event_id: EventId = None


class SessionClose(_Msg, tag="session.close"):
    cancel_tasks: bool = True
    event_id: EventId = None


class InputAppend(_Msg, tag="input_text.append"):
    text: str
    t: float | None = None  # seconds on the agent clock (since session.created); None: now
    event_id: EventId = None


class ResponseCancel(_Msg, tag="response.cancel"):
    cancel_tasks: bool = False
    response_id: str | None = None  # as OpenAI: when given, it must be the response in flight
    event_id: EventId = None


class ItemTruncate(_Msg, tag="conversation.item.truncate"):
    item_id: str
    audio_end_ms: float | None = None
    played_chars: int | None = None
    content_index: int = 0  # OpenAI's field; only 0 exists here
    event_id: EventId = None


class DelegationCancel(_Msg, tag="delegation.cancel"):
    delegation_id: str
    event_id: EventId = None


class DelegationResultSubmit(_Msg, tag="delegation.result.submit"):
    delegation_id: str
    output: str
    event_id: EventId = None


class FunctionCallOutput(_Obj, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str


class ItemCreate(_Msg, tag="conversation.item.create"):
    item: FunctionCallOutput
    event_id: EventId = None


ClientMessage = (
    SessionCreate | SessionUpdate | SessionClose | InputAppend | ResponseCancel | ItemTruncate | DelegationCancel
    | DelegationResultSubmit | ItemCreate
)
CLIENT_TYPES = tuple(sorted(t.__struct_config__.tag for t in ClientMessage.__args__))  # type: ignore[attr-defined]
_DECODER = msgspec.json.Decoder(ClientMessage)


def parse_client_message(frame: str | bytes) -> ClientMessage:
    """A typed client message, or ``ProtocolError`` naming what is wrong (with the frame's
    ``event_id`` when it could be read)."""
    return decode_client_message(_DECODER, CLIENT_TYPES, frame)


def type_of(msg: ClientMessage) -> str:
    return msg.__struct_config__.tag  # type: ignore[return-value]


def server_event(event_type: str, event_id: EventId = None, /, **fields: Any) -> dict[str, Any]:
    """A server event: ``type``, the ``event_id`` of the client message it answers (None if none), fields."""
    return {"type": event_type, "event_id": event_id, **fields}
