"""A light per-step trace of the engine thread: when each step ran, what it cost in CPU, and which
requests of which class it served (``LLMEngine.step_trace``; off, None, by default).

One ``TracedStep`` per non-empty step: its start and end (``time.monotonic``, the clock of
``Request.arrival_time``), the engine thread's CPU seconds over it (``time.thread_time``: its wall
time minus this is time the thread was descheduled or waited for the GIL), the tokens it gave
interactive requests (class >= ``PRIORITY_INTERACTIVE``) and lower ones, and for each interactive
request it served, that request's id and arrival. Two clock readings and a tuple per step: cheap
enough for a benchmark to leave on. ``records`` keeps the last ``max_steps``.

Call order (engine thread): ``begin()`` before the step's schedule, ``end(scheduled)`` after its
results (a step that scheduled nothing is not recorded: call ``end`` with an empty list).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from execstate.engine.priority import PRIORITY_INTERACTIVE


class _Req(Protocol):
    request_id: str
    priority: int
    arrival_time: float


class _Scheduled(Protocol):
    @property
    def request(self) -> _Req: ...

    @property
    def num_new_tokens(self) -> int: ...


class TracedStep(NamedTuple):
    t0: float
    t1: float
    cpu_s: float
    interactive_tokens: int
    batch_tokens: int
    interactive: tuple[tuple[str, float], ...]  # (request id, its arrival), each interactive request served

    @property
    def wall_s(self) -> float:
        return self.t1 - self.t0

    @property
    def off_cpu_s(self) -> float:
        """Wall seconds the engine thread did not run during the step (descheduled, or waiting for the GIL)."""
        return max(0.0, self.wall_s - self.cpu_s)


class StepTrace:
    """The records of the engine's last ``max_steps`` non-empty steps (module docstring)."""

    def __init__(self, max_steps: int = 100_000) -> None:
        if max_steps < 1:
            raise ValueError(f"StepTrace: max_steps must be >= 1, got {max_steps}")
        self.records: deque[TracedStep] = deque(maxlen=max_steps)
        self._t0 = self._cpu0 = 0.0

    def begin(self) -> None:
        self._t0, self._cpu0 = time.monotonic(), time.thread_time()

    def end(self, scheduled: Sequence[_Scheduled]) -> None:
        if not scheduled:
            return
        t1, cpu = time.monotonic(), time.thread_time() - self._cpu0
        hi = lo = 0
        served: list[tuple[str, float]] = []
        for s in scheduled:
            if s.request.priority >= PRIORITY_INTERACTIVE:
                hi += s.num_new_tokens
                served.append((s.request.request_id, s.request.arrival_time))
            else:
                lo += s.num_new_tokens
        self.records.append(TracedStep(self._t0, t1, cpu, hi, lo, tuple(served)))
