"""The events a duplex agent emits (one stream per agent, in order). Modality-independent: text
deltas with timestamps; an audio front would add audio deltas beside them.

Every event carries ``t`` (seconds on the agent's clock) and ``epoch`` (the front epoch it was
produced in, ``agent/fence.py``). Response events carry ``response_id``, which is also the id of
the conversation item holding the agent's reply (``DuplexAgent.truncate`` takes it). ``type``
strings follow the OpenAI Realtime names where one exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NewType

ResponseId = NewType("ResponseId", str)
DelegationId = NewType("DelegationId", str)


@dataclass(frozen=True)
class AgentEvent:
    type: ClassVar[str] = "event"
    t: float
    epoch: int


@dataclass(frozen=True)
class TurnEvent(AgentEvent):
    """What the turn policy decided on the input stream (``agent/turn_policy.py``): ``kind`` is
    ``end_of_turn``, ``barge_in``, ``hold`` (the agent pauses: maybe an interruption),
    ``resume`` (a false interruption: a backchannel-length burst ended) or ``backchannel``
    (short input while the agent speaks, ignored without holding)."""

    type: ClassVar[str] = "input.turn"
    kind: str
    text: str = ""


@dataclass(frozen=True)
class ResponseCreated(AgentEvent):
    type: ClassVar[str] = "response.created"
    response_id: ResponseId
    cause: str  # "turn" (a user turn ended), "result" (speaking a delegation's result)


@dataclass(frozen=True)
class OutputDelta(AgentEvent):
    type: ClassVar[str] = "response.output_text.delta"
    response_id: ResponseId
    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ResponseDone(AgentEvent):
    """The one terminal event of a response: ``status`` is ``completed``, ``cancelled`` or ``failed``."""

    type: ClassVar[str] = "response.done"
    response_id: ResponseId
    status: str
    reason: str = ""
    text: str = ""  # everything the response emitted


@dataclass(frozen=True)
class DelegationCreated(AgentEvent):
    type: ClassVar[str] = "delegation.created"
    delegation_id: DelegationId
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    source: str = "policy"  # "policy" (a configured rule) or "model" (a tool call in the front's output)


@dataclass(frozen=True)
class DelegationResult(AgentEvent):
    """A back-end result settled in the ledger: ``status`` ``completed`` (appended to the front's
    context at a step boundary: ``appended`` True), ``stale`` (for an old epoch: never spoken),
    ``failed`` (the task raised: ``error``)."""

    type: ClassVar[str] = "delegation.result"
    delegation_id: DelegationId
    status: str
    result: str = ""
    error: str = ""
    appended: bool = False


@dataclass(frozen=True)
class ErrorEvent(AgentEvent):
    type: ClassVar[str] = "error"
    code: str
    message: str
