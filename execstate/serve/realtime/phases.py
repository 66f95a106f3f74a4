"""The phase machine of a realtime connection: one machine, a table per protocol (pure Python).

A connection is always in one :class:`Phase` of its protocol's :class:`PhaseTable`, or in
:data:`GONE` once its socket went. A phase says which client messages may be acted on now, by
``type``; ``PhaseMachine.check`` raises the ``ProtocolError`` a refused message gets instead (the
connection answers it with an ``error`` event and stays open):

- ``refuse``: these types get this refusal (checked first);
- ``allow``: when given, only these types (and none of ``refuse``) are acted on, every other
  type gets ``otherwise``; when ``None``, every type not refused is acted on;
- :data:`GONE` refuses everything (``connection_closed``).

A refusal's message is a ``str.format`` template over ``type`` (the refused message's) and the
connection's *values* (``PhaseTable.values``: e.g. ``session_id``), which moves set.

Phases change only by :class:`Move`\\ s of the table (``PhaseMachine.move``): a move from
``sources`` (``None``: any phase) to ``target``. From a phase outside its sources a *strict* move
raises ``RuntimeError`` (a handler's bug: nothing changes), another move does nothing. Entering the
table's ``start`` phase resets every value to ``None``. ``gone()`` enters :data:`GONE` from
anywhere, and nothing leaves it (a move there does nothing: the connection is closing).

Which message causes which move is the protocol's handlers' business; this module only keeps the
phase, the values and the rules (tests/serve/test_realtime_phases.py drives every protocol's
table without a server).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from execstate.serve.realtime.errors import EventId, ProtocolError


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str  # a str.format template over ``type`` and the connection's values

    def error(self, msg_type: str, values: Mapping[str, Any], event_id: EventId) -> ProtocolError:
        return ProtocolError(self.code, self.message.format(type=msg_type, **values), event_id)


@dataclass(frozen=True, eq=False)
class Phase:
    name: str
    allow: frozenset[str] | None = None
    refuse: Mapping[str, Refusal] = field(default_factory=dict)
    otherwise: Refusal | None = None

    def __post_init__(self) -> None:
        if (self.allow is None) != (self.otherwise is None):
            raise ValueError(f"phase {self.name}: give 'otherwise' exactly when 'allow' is given")

    def refusal(self, msg_type: str) -> Refusal | None:
        """The refusal ``msg_type`` gets in this phase (``None``: it is acted on)."""
        if msg_type in self.refuse:
            return self.refuse[msg_type]
        if self.allow is not None and msg_type not in self.allow:
            return self.otherwise
        return None


GONE = Phase("gone", allow=frozenset(), otherwise=Refusal("connection_closed", "the connection is closing"))


@dataclass(frozen=True, eq=False)
class Move:
    name: str
    sources: frozenset[Phase] | None  # None: from any phase
    target: Phase
    strict: bool = False


@dataclass(frozen=True)
class PhaseTable:
    start: Phase
    phases: tuple[Phase, ...]  # every phase but GONE, ``start`` first
    moves: tuple[Move, ...]
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.phases or self.phases[0] is not self.start or GONE in self.phases:
            raise ValueError("a phase table lists its phases with 'start' first, and never GONE")
        for move in self.moves:
            if move.target not in self.phases or not (move.sources or set()) <= set(self.phases):
                raise ValueError(f"move {move.name} leaves the table's phases")
        names = set(self.values) | {"type"}
        for phase in (*self.phases, GONE):
            for r in (*phase.refuse.values(), *([phase.otherwise] if phase.otherwise is not None else [])):
                used = {f for _, f, _, _ in string.Formatter().parse(r.message) if f}
                if not used <= names:
                    raise ValueError(f"phase {phase.name}: refusal {r.code} names {sorted(used - names)}")


class PhaseMachine:
    """One connection's phase and values (module docstring)."""

    def __init__(self, table: PhaseTable) -> None:
        self.table = table
        self.phase = table.start
        self.values: dict[str, Any] = dict.fromkeys(table.values)

    def check(self, msg_type: str, event_id: EventId = None) -> None:
        """Raise the ``ProtocolError`` for ``msg_type`` in this phase, if it is not acted on now."""
        refusal = self.phase.refusal(msg_type)
        if refusal is not None:
            raise refusal.error(msg_type, self.values, event_id)

    def move(self, move: Move, **values: Any) -> None:
        """Take ``move`` (setting ``values``), when the current phase is one of its sources."""
        if move not in self.table.moves:
            raise ValueError(f"move {move.name} is not in this connection's table")
        unknown = set(values) - set(self.values)
        if unknown:
            raise ValueError(f"move {move.name}: unknown value(s) {sorted(unknown)}")
        if self.phase is GONE:
            return
        if move.sources is not None and self.phase not in move.sources:
            if move.strict:
                raise RuntimeError(f"connection phase {self.phase.name}: {move.name} needs one of "
                                   f"{sorted(p.name for p in move.sources)}")
            return
        if move.target is self.table.start:
            self.values = dict.fromkeys(self.table.values)
        self.values.update(values)
        self.phase = move.target

    def gone(self) -> None:
        """The socket went: every later message is refused; nothing leaves GONE."""
        self.phase = GONE
