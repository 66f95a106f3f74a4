"""A decode step's time, phase by phase, from the kernels' own timers (``EngineConfig.step_timers``).

Two kinds of reading, both added up per step and kept as one ``StepRecord`` per step:

- **kernel phases**: inside the whole-layer decode call every OpenMP thread charges its own time
  to ``KERNEL_PHASES`` (``kernels/csrc/step_clock.h``: norms, the q/k/v matmul, QK-norm + RoPE +
  the K/V write, attention, the output projection, the router matmul, routing and the MoE experts
  (a MoE layer that runs its experts in the call), the dense-MLP matmuls, waits at the
  barriers inside the call, the fork before and the join after it). ``StepRecord.kernel`` is
  thread 0's, the calling thread's, so its phases lie on the step's critical path;
  ``StepRecord.kernel_threads`` has every thread's.
- **wall segments** around the Python-level calls (``SEGMENTS``): the whole-layer calls as seen
  from Python (``layers``), the MoE routing and expert kernels, the embedding + RoPE tables, the
  final norm, the LM head, the sampler with output building, the scheduler, the runner's input
  building; ``step`` is the whole step's wall time.

What is left of ``step`` after the segments (``StepRecord.python``) is Python and bookkeeping
that no segment names. Two clocks (``clock``): ``"wall"`` (``perf_counter``, ~60 ns a reading; the
kernels' ~20 ns) or ``"cpu"``, the engine thread's CPU time (``thread_time``; each kernel thread
its own, ~0.2 us a reading): on a shared host a descheduled thread's wall time lands in whatever
phase it was in, its CPU time does not, so ``"cpu"`` gives what each phase costs and ``"wall"``
what it took. A few hundred readings per step: off by default, on only when a breakdown is asked
for (``execstate bench throughput --breakdown``).

Call order (engine thread): ``begin_step()``, then any number of ``add(segment, t0)`` and
kernel calls given ``kernel_args()``, then ``end_step(batch, context_lens)``.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

CLOCKS = ("wall", "cpu")
KERNEL_PHASES = ("norm", "qkv", "rope_kv", "attention", "o_proj", "router", "routing", "experts", "mlp", "barrier",
                 "fork", "join")
SEGMENTS = ("schedule", "inputs", "embed", "layers", "routing", "experts", "final_norm", "lm_head", "sample", "step")


class StepRecord(NamedTuple):
    """One step: ``batch`` sequences decoding (or prefill tokens when ``prefill``), their context
    lengths, seconds per segment (``SEGMENTS``) and per kernel phase of thread 0 and of each thread."""

    batch: int
    prefill: bool
    context_lens: tuple[int, ...]
    segments: dict[str, float]
    kernel: dict[str, float]
    kernel_threads: tuple[dict[str, float], ...]
    wall: float  # the step's wall seconds, whichever the clock

    @property
    def python(self) -> float:
        """Seconds of the step no segment names (Python, bookkeeping, the output of the step)."""
        s = self.segments
        return s["step"] - sum(v for k, v in s.items() if k != "step")

    @property
    def call_overhead(self) -> float:
        """Seconds of the whole-layer calls outside the kernel's own phases (argument passing, GIL)."""
        return self.segments["layers"] - sum(self.kernel.values())


class StepTimers:
    """Accumulators for the step in progress and the records of the finished ones."""

    def __init__(self, threads: int, clock: str = "wall") -> None:
        if threads < 1:
            raise ValueError(f"StepTimers: threads must be >= 1, got {threads}")
        if clock not in CLOCKS:
            raise ValueError(f"StepTimers: clock must be one of {CLOCKS}, got {clock!r}")
        self.threads, self.clock = threads, clock
        self._now = time.thread_time if clock == "cpu" else time.perf_counter
        self._kernel = torch.zeros((threads, len(KERNEL_PHASES)), dtype=torch.float64)
        self._segments = dict.fromkeys(SEGMENTS, 0.0)
        self._t_step = self._wall_step = 0.0
        self.records: list[StepRecord] = []

    def now(self) -> float:
        """A reading of this timer's clock (seconds), the ``t0`` of ``add``."""
        return self._now()

    def kernel_args(self) -> tuple[int, int, int]:
        """(pointer, threads, clock) of the kernels' float64 ``[threads, len(KERNEL_PHASES)]``
        accumulators; clock 1: each thread's CPU time, 0: wall time."""
        return self._kernel.data_ptr(), self.threads, int(self.clock == "cpu")

    def begin_step(self) -> None:
        self._kernel.zero_()
        for k in self._segments:
            self._segments[k] = 0.0
        self._t_step = self._now()
        self._wall_step = time.perf_counter()

    def add(self, segment: str, t0: float, less: float = 0.0) -> float:
        """Charge the time since ``t0`` (a ``now()`` reading), minus ``less`` seconds charged to
        other segments meanwhile, to ``segment``; returns now."""
        t = self._now()
        self._segments[segment] += t - t0 - less
        return t

    def total(self, segments: tuple[str, ...]) -> float:
        """Seconds charged so far this step to ``segments``."""
        return sum(self._segments[s] for s in segments)

    def end_step(self, batch: int, context_lens: tuple[int, ...], prefill: bool) -> StepRecord:
        self._segments["step"] = self._now() - self._t_step
        per_thread = tuple(dict(zip(KERNEL_PHASES, (v * 1e-9 for v in row), strict=True))
                           for row in self._kernel.tolist())
        rec = StepRecord(batch, prefill, context_lens, dict(self._segments), per_thread[0], per_thread,
                         time.perf_counter() - self._wall_step)
        self.records.append(rec)
        return rec


__all__ = ["CLOCKS", "KERNEL_PHASES", "SEGMENTS", "StepRecord", "StepTimers"]
