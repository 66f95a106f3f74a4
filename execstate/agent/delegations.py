"""The agent's back-end work: delegations opened, run and settled (``DuplexAgent``'s collaborator).

``Delegations`` ties the ledger (``ledger.py``: states and refusals) to the back end
(``backend.py``: the running tasks) and to the agent's event stream. Contract:

- ``delegate(call, source, t, epoch)`` opens a delegation and starts its task, emitting
  ``delegation.created``; an unknown tool, a full ledger or a back end already running its
  ``max_tasks`` tasks (``too_many_tasks``) is an ``error`` event and returns None.
- A task's result (``on_result``, called by the back end) or a result delivered from outside
  (``deliver``) is resolved in the ledger at the epoch current then: a completed one waits in the
  *ready* queue until the agent's next step boundary takes it (``take_ready``); a stale or failed
  one is reported at once (``delegation.result``); a result the ledger refuses (late, duplicate,
  unknown) is an ``error`` event from the back end, or a ``LedgerError`` to the caller of ``deliver``.
- ``take_ready(epoch, t)`` returns the ready delegations still of ``epoch`` (to append and speak)
  and marks the others stale (reported, never spoken).
- Nothing here touches the front or the response fence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from execstate.agent.agent_events import (
    AgentEvent,
    DelegationCreated,
    DelegationId,
    DelegationResult,
    ErrorEvent,
)
from execstate.agent.backend import Backend
from execstate.agent.delegation import ToolCall
from execstate.agent.ledger import Delegation, DelegationState, LedgerError, ToolLedger


class Delegations:
    def __init__(self, backend: Backend, emit: Callable[[AgentEvent], None], now: Callable[[], float],
                 epoch: Callable[[], int], on_ready: Callable[[], None], accepting: Callable[[], bool]) -> None:
        """``now``/``epoch``: the agent's clock and current epoch; ``on_ready``: wakes the agent's loop;
        ``accepting``: False once the agent stopped (a task's result then goes nowhere)."""
        self.backend = backend
        self.ledger = ToolLedger()
        self._emit = emit
        self._now = now
        self._epoch = epoch
        self._on_ready = on_ready
        self._accepting = accepting
        self._ready: deque[DelegationId] = deque()

    def delegate(self, call: ToolCall, source: str, t: float) -> Delegation | None:
        epoch = self._epoch()
        if call.tool not in self.backend.tools:
            self._emit(ErrorEvent(t, epoch, "unknown_tool", f"no back-end tool {call.tool!r}"))
            return None
        if self.backend.full:
            self._emit(ErrorEvent(t, epoch, "too_many_tasks", f"{self.backend.limits.max_tasks} back-end tasks are "
                                  f"running; {call.tool!r} was not started"))
            return None
        try:
            d = self.ledger.open(call.tool, call.arguments, epoch, t, source)
        except LedgerError as exc:
            self._emit(ErrorEvent(t, epoch, exc.code, exc.message))
            return None
        self._emit(DelegationCreated(t, d.epoch, d.delegation_id, d.tool, dict(d.arguments), source))
        self.backend.start(d, self.on_result)
        return d

    def on_result(self, delegation_id: DelegationId, result: str | None, error: str | None) -> None:
        """The back end's callback when a task ends (``backend.Done``)."""
        if not self._accepting():
            return
        try:
            d = self.ledger.resolve(delegation_id, result, self._epoch(), self._now(), error)
        except LedgerError as exc:
            self._emit(ErrorEvent(self._now(), self._epoch(), exc.code, exc.message))
            return
        self._settle(d)

    def deliver(self, delegation_id: str, result: str) -> None:
        """A result from outside (a tool the client runs); ``LedgerError`` if refused."""
        self._settle(self.ledger.resolve(delegation_id, str(result), self._epoch(), self._now()))

    def cancel(self, delegation_id: str) -> bool:
        """Cancel one open delegation and its task (ledger: cancelled); False if it is not open."""
        d = self.ledger.get(delegation_id)
        if not self.ledger.cancel(d.delegation_id):
            return False
        self.backend.cancel(d.delegation_id)
        return True

    def cancel_open(self) -> None:
        for did in self.ledger.open_ids():
            self.cancel(did)

    @property
    def has_ready(self) -> bool:
        return bool(self._ready)

    def take_ready(self, epoch: int, t: float) -> Iterator[Delegation]:
        """The ready delegations of ``epoch``, in arrival order; the others become stale as they come
        (reported in that order; module docstring). Consume it whole."""
        while self._ready:
            d = self.ledger.get(self._ready.popleft())
            if d.epoch != epoch:
                self.ledger.mark_stale(d.delegation_id)
                self._emit(DelegationResult(t, epoch, d.delegation_id, "stale", d.result or ""))
                continue
            yield d

    def _settle(self, d: Delegation) -> None:
        if d.state is DelegationState.COMPLETED:
            self._ready.append(d.delegation_id)
            self._on_ready()
        else:
            self._emit(DelegationResult(self._now(), self._epoch(), d.delegation_id, d.state.value,
                                        d.result or "", d.error or ""))
