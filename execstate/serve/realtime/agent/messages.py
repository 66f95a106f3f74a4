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

Each message is a struct below (listed in ``MESSAGES``); ``PHASES`` says which a connection acts
on when; ``AGENT_PROTOCOL`` puts them together for the framework (``serve/realtime/``), which
answers malformed frames (``invalid_message``, ``unknown_type``, ``message_too_large``). The
handlers are ``handlers.py``.

Phases (a connection drives at most one agent at a time)::

    NO_SESSION --session.created--> ACTIVE --session.closed--> NO_SESSION
    ACTIVE --the agent stopped by itself (front failed, events overflowed)--> ENDED
    ENDED --session.closed--> NO_SESSION
    any --disconnect--> GONE

Refusals (an ``error`` event; the connection stays): ``no_session`` (anything but
``session.create`` while no agent is open), ``session_exists`` (``session.create`` while one is
open: send ``session.close`` first), ``session_ended`` (anything but ``session.close`` once the
agent stopped by itself: its ``error`` event said why), ``connection_closed`` (after the socket
went). Whether a response is in flight is the agent's business (``response.cancel`` without one
gets ``no_response`` from the handler), since responses start and end on the agent's own clock.
"""

from __future__ import annotations

from typing import Any

import msgspec

from execstate.agent.ledger import LedgerError
from execstate.serve.realtime.errors import ErrorRule, EventId, ProtocolError
from execstate.serve.realtime.messages import Message, MessageTable
from execstate.serve.realtime.phases import Move, Phase, PhaseTable, Refusal
from execstate.serve.realtime.protocol import RealtimeProtocol


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


class SessionCreate(Message, tag="session.create"):
    session: AgentSessionConfig = msgspec.field(default_factory=AgentSessionConfig)
    event_id: EventId = None


class SessionUpdate(Message, tag="session.update"):
    session: AgentSessionConfig
    event_id: EventId = None


class SessionClose(Message, tag="session.close"):
    cancel_tasks: bool = True
    event_id: EventId = None


class InputAppend(Message, tag="input_text.append"):
    text: str
    t: float | None = None  # seconds on the agent clock (since session.created); None: now
    event_id: EventId = None


class ResponseCancel(Message, tag="response.cancel"):
    cancel_tasks: bool = False
    response_id: str | None = None  # as OpenAI: when given, it must be the response in flight
    event_id: EventId = None


class ItemTruncate(Message, tag="conversation.item.truncate"):
    item_id: str
    audio_end_ms: float | None = None
    played_chars: int | None = None
    content_index: int = 0  # OpenAI's field; only 0 exists here
    event_id: EventId = None


class DelegationCancel(Message, tag="delegation.cancel"):
    delegation_id: str
    event_id: EventId = None


class DelegationResultSubmit(Message, tag="delegation.result.submit"):
    delegation_id: str
    output: str
    event_id: EventId = None


class FunctionCallOutput(_Obj, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str


class ItemCreate(Message, tag="conversation.item.create"):
    item: FunctionCallOutput
    event_id: EventId = None


MESSAGES = MessageTable(
    SessionCreate, SessionUpdate, SessionClose, InputAppend, ResponseCancel, ItemTruncate, DelegationCancel,
    DelegationResultSubmit, ItemCreate,
)

SESSION_EXISTS = Refusal("session_exists", "{type}: this connection already has agent session {session_id!r}; "
                         "send session.close first")
NO_SESSION = Phase("no_session", allow=frozenset({"session.create"}), otherwise=Refusal(
    "no_session", "{type}: no agent session on this connection; send session.create first"))
ACTIVE = Phase("active", refuse={"session.create": SESSION_EXISTS})
ENDED = Phase("ended", refuse={"session.create": SESSION_EXISTS}, allow=frozenset({"session.close"}),
              otherwise=Refusal("session_ended", "{type}: agent session {session_id!r} has stopped (see its error "
                                "event); send session.close"))
OPEN = Move("open", frozenset({NO_SESSION}), ACTIVE, strict=True)  # session.created
END = Move("end", frozenset({ACTIVE}), ENDED)  # the agent stopped by itself
CLOSE = Move("close", None, NO_SESSION)  # session.closed
PHASES = PhaseTable(NO_SESSION, (NO_SESSION, ACTIVE, ENDED), (OPEN, END, CLOSE), values=("session_id",))

LEDGER_CODES = {"unknown": "unknown_delegation", "duplicate": "duplicate_result", "late": "late_result"}
ERRORS = (
    ErrorRule(LedgerError, lambda e, event_id: ProtocolError(LEDGER_CODES.get(e.code, e.code), e.message, event_id)),
)

AGENT_PROTOCOL = RealtimeProtocol("agent", MESSAGES, PHASES, errors=ERRORS)
