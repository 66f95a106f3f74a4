"""Wall time the engine spends on route return (R3) bookkeeping: the direct R3 overhead.

Whole-run on/off throughput ratios of two engines are noisy on a shared machine (a few
percent run to run, and engines built at different times can differ by as much). This
clock times the R3-only work itself, per step, in the engine that does it:

- runner: building the step's ``RouteCapture`` and turning its ids into one numpy array;
- engine: copying each request's rows into its ``RouteTrace``;
- KV cache manager: storing a completed block's route record with the block;
- output: assembling a finished request's ``routed_experts`` array.

Not timed: each MoE layer's ``RouteCapture.record`` (keeps a reference to the layer's ids,
a list store per layer). ``seconds`` only grows; readers diff it around a run.
"""

from __future__ import annotations

import time


class R3Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def add_since(self, t0: float) -> None:
        """Add the wall time since ``t0`` (a ``time.perf_counter()`` reading)."""
        self.seconds += time.perf_counter() - t0
