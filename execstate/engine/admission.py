"""Admission control: a bounded waiting queue, enforced before work reaches the engine.

``AdmissionControl`` (pure Python, thread-safe) counts the requests that wait for the
engine: slots *reserved* by callers (held by an ``Admission`` ticket or travelling in
an add command towards the engine thread) plus the engine scheduler's waiting queue as
the engine thread last *published* it. A caller reserves all the slots it needs at
once (``admit``), so a client request with several prompts or ``n > 1`` is admitted
whole or not at all; beyond ``max_waiting`` it is refused at once
(``EngineOverloadedError``, HTTP 429 with ``Retry-After``), before the engine thread
does any work for it. A request that needs more slots than the bound can ever offer is
a ``ValueError`` (HTTP 400): retrying would not help.

Only requests beyond the engine's free sequence slots count as waiting: a burst of k
requests on an idle engine with ``max_num_seqs >= k`` is admitted whole, because they all
start running at the next step. The engine thread publishes its waiting queue *minus* its
free sequence slots (``max_num_seqs - running``), which may be negative.

Call order: ``admit(k)`` → ``take(ticket)`` once per request handed to the engine
thread → the engine thread calls ``on_added(num_waiting)`` after handling each of them
(added or rejected) and ``publish(num_waiting)`` after each step → ``release(ticket)``
when the caller is done, which returns the slots it never used. Until the engine
thread has published, the count errs high (a slot is counted both as reserved and as
waiting for an instant), never low.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

RETRY_AFTER_S = 1


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full; retry after ``retry_after_s`` seconds (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Admission:
    """Waiting-queue slots reserved for one client request and not yet used."""

    slots: int


class AdmissionControl:
    def __init__(self, max_waiting: int | None, max_running: int = 0) -> None:
        """``max_running``: the engine's sequence slots (``max_num_seqs``); a single request may
        need up to ``max_waiting + max_running`` slots before it can never fit."""
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting_requests must be >= 1 (or None: unbounded), got {max_waiting}")
        self.max_waiting = max_waiting
        self.max_running = max_running
        self._lock = threading.Lock()
        self._reserved = 0
        self._waiting = 0  # the scheduler's waiting queue minus its free sequence slots, as last published

    @property
    def num_waiting(self) -> int:
        """Requests counted against the bound now (reserved + waiting in the engine, beyond
        the free sequence slots)."""
        with self._lock:
            return max(0, self._reserved + self._waiting)

    def admit(self, count: int) -> Admission:
        """Reserve ``count`` slots, all or none."""
        if count < 1:
            raise ValueError(f"an admission needs at least one request, got {count}")
        limit = self.max_waiting
        if limit is not None and count > limit + self.max_running:
            raise ValueError(
                f"this request needs {count} engine requests (prompts x n), more than the {limit + self.max_running} "
                "the server can hold (--max-waiting-requests + --max-num-seqs)"
            )
        with self._lock:
            if limit is not None and self._reserved + self._waiting + count > limit:
                raise EngineOverloadedError(
                    f"the server is overloaded: {max(0, self._reserved + self._waiting)} requests are waiting "
                    f"(limit {limit}); retry later"
                )
            self._reserved += count
        return Admission(count)

    def take(self, ticket: Admission) -> None:
        """One slot of ``ticket`` goes with a request to the engine thread."""
        with self._lock:
            if ticket.slots < 1:
                raise RuntimeError("this admission has no slot left: admit one per engine request")
            ticket.slots -= 1

    def release(self, ticket: Admission) -> None:
        """Return the slots ``ticket`` did not use (idempotent)."""
        with self._lock:
            self._reserved -= ticket.slots
            ticket.slots = 0

    def on_added(self, num_waiting: int, num_free_slots: int = 0) -> None:
        """Engine thread: a request holding a slot was handled; the scheduler now has
        ``num_waiting`` waiting requests and ``num_free_slots`` free sequence slots."""
        with self._lock:
            self._reserved -= 1
            self._waiting = num_waiting - num_free_slots

    def publish(self, num_waiting: int, num_free_slots: int = 0) -> None:
        """Engine thread: the scheduler's waiting queue and free sequence slots after a step
        or command."""
        with self._lock:
            self._waiting = num_waiting - num_free_slots
