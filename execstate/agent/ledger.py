"""The delegation (tool) ledger: every back-end task the front started, and its outcome.

Pure Python. States::

    OPEN --resolve(ok, same epoch)--> COMPLETED --mark_stale--> STALE   (epoch moved before it was spoken)
    OPEN --resolve(ok, older epoch)--> STALE     (never spoken)
    OPEN --resolve(error)----------> FAILED
    OPEN --cancel------------------> CANCELLED

Results that cannot be accepted raise :class:`LedgerError` with distinct codes and change
nothing: ``unknown`` (no such delegation), ``duplicate`` (already settled: completed, stale or
failed), ``late`` (it was cancelled before the result came). ``open`` beyond ``max_open``
delegations in OPEN raises ``capacity``. The ledger remembers the last ``remember`` settled
delegations (a result for one forgotten is ``unknown``).
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from execstate.agent.agent_events import DelegationId
from execstate.errors import CodedError


class DelegationState(enum.Enum):
    OPEN = "open"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    STALE = "stale"
    FAILED = "failed"


class LedgerError(CodedError):
    """A result or an open the ledger refuses: ``unknown``, ``duplicate``, ``late``, ``capacity``."""


@dataclass
class Delegation:
    delegation_id: DelegationId
    tool: str
    arguments: dict[str, Any]
    epoch: int
    t_created: float
    source: str
    state: DelegationState = DelegationState.OPEN
    result: str | None = None
    error: str | None = None
    t_result: float | None = None
    t_appended: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class ToolLedger:
    def __init__(self, max_open: int = 16, remember: int = 1024) -> None:
        if max_open < 1 or remember < 1:
            raise ValueError("max_open and remember must be >= 1")
        self.max_open = max_open
        self.remember = remember
        self._ids = itertools.count(1)
        self._all: OrderedDict[DelegationId, Delegation] = OrderedDict()

    def open(self, tool: str, arguments: dict[str, Any], epoch: int, t: float, source: str) -> Delegation:
        if len(self.open_ids()) >= self.max_open:
            raise LedgerError("capacity", f"{self.max_open} delegations are already open")
        d = Delegation(DelegationId(f"dlg_{next(self._ids)}"), tool, dict(arguments), epoch, t, source)
        self._all[d.delegation_id] = d
        self._trim()
        return d

    def get(self, delegation_id: str) -> Delegation:
        d = self._all.get(DelegationId(delegation_id))
        if d is None:
            raise LedgerError("unknown", f"no delegation {delegation_id!r}")
        return d

    def open_ids(self) -> list[DelegationId]:
        return [k for k, d in self._all.items() if d.state is DelegationState.OPEN]

    def resolve(self, delegation_id: str, result: str | None, epoch: int, t: float,
                error: str | None = None) -> Delegation:
        """Settle an OPEN delegation with its result (or ``error``); ``epoch`` is the front's now."""
        d = self.get(delegation_id)
        if d.state is DelegationState.CANCELLED:
            raise LedgerError("late", f"delegation {delegation_id!r} was cancelled before its result came")
        if d.state is not DelegationState.OPEN:
            raise LedgerError("duplicate", f"delegation {delegation_id!r} already has a result ({d.state.value})")
        d.t_result = t
        if error is not None:
            d.state, d.error = DelegationState.FAILED, error
        else:
            d.result = result
            d.state = DelegationState.COMPLETED if d.epoch == epoch else DelegationState.STALE
        return d

    def mark_stale(self, delegation_id: str) -> Delegation:
        """COMPLETED -> STALE: the epoch moved before the result was appended."""
        d = self.get(delegation_id)
        if d.state is not DelegationState.COMPLETED:
            raise LedgerError("invalid", f"only a completed delegation becomes stale, not {d.state.value}")
        d.state = DelegationState.STALE
        return d

    def cancel(self, delegation_id: str) -> bool:
        """OPEN -> CANCELLED (True); False if it was already settled."""
        d = self.get(delegation_id)
        if d.state is not DelegationState.OPEN:
            return False
        d.state = DelegationState.CANCELLED
        return True

    def _trim(self) -> None:
        settled = [k for k, d in self._all.items() if d.state is not DelegationState.OPEN]
        for k in settled[: max(0, len(settled) - self.remember)]:
            del self._all[k]
