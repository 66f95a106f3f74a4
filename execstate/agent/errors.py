"""Errors the agent raises to its caller, and the agent's step statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from execstate.errors import CodedError


class AgentError(CodedError):
    """A refused call: ``code`` ``invalid`` (bad input), ``not_found`` (unknown item), ``closed``."""


@dataclass
class Interrupt:
    t_accept: float
    old_epoch: int
    t_step_end: float | None = None  # when the front's cancelled step ended (None: no step was running)


@dataclass
class AgentStats:
    """``step_s``: each front step's seconds (a drafted first step's too, ~0); ``step_at``: when each
    began (``time.monotonic``, the engine's request clock), in the same order."""

    step_s: list[float] = field(default_factory=list)
    step_at: list[float] = field(default_factory=list)
    interrupts: list[Interrupt] = field(default_factory=list)
