"""The token masks of a step's constrained rows, computed while the forward pass runs.

Call order (``LLMEngine`` on the engine thread, once per step):

1. ``start(sched)`` after scheduling, before the forward pass: for every scheduled request that
   samples this step and has a grammar matcher (``Request.grammar``), its mask is computed into
   one int32 bitmask tensor on a worker thread (llguidance's executor, the GIL dropped), so it
   overlaps the forward pass; ``None`` when no sampling row is constrained (nothing is started).
   While ``PendingMask.busy()`` the forward pass's kernels run on one thread fewer
   (``kernels/team.py``), so the worker has a core instead of descheduling a kernel thread that
   its partner then waits for at every barrier.
2. the forward pass (``ModelRunner.execute``);
3. ``PendingMask.wait()`` before sampling: the :class:`TokenMask` for ``engine/sampler.py``,
   rows numbered as the logits rows (the sampling rows in scheduled order). An error in the
   worker is raised here and fails the step like any step error.

Matchers are read by the worker between 1 and 3 and advanced only after 3 (``StepResults``), on
the engine thread: no matcher changes while its mask is computed.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import llguidance as llg
import torch

from execstate.engine.grammar.matcher import GrammarMatcher
from execstate.engine.scheduler import SchedulerOutput
from execstate.engine.token_mask import TokenMask


class PendingMask:
    def __init__(self, rows: list[int], bits: torch.Tensor, done: Future[None]) -> None:
        self._rows = rows
        self._bits = bits
        self._done = done

    def busy(self) -> bool:
        """Whether the worker is still computing (the forward pass lends it a thread meanwhile)."""
        return not self._done.done()

    def wait(self) -> TokenMask:
        self._done.result()
        return TokenMask(torch.tensor(self._rows, dtype=torch.long), self._bits)


class GrammarMasks:
    def __init__(self, vocab_size: int) -> None:
        self._words = (vocab_size + 31) // 32
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")  # threads start on first use
        self._executor: llg.LLExecutor | None = None

    def start(self, sched: SchedulerOutput) -> PendingMask | None:
        rows: list[int] = []
        matchers: list[GrammarMatcher] = []
        j = 0
        for s in sched.scheduled:
            if s.samples:
                g = s.request.grammar
                if g is not None:
                    rows.append(j)
                    matchers.append(g)
                j += 1
        if not matchers:
            return None
        bits = torch.empty((len(matchers), self._words), dtype=torch.int32)
        return PendingMask(rows, bits, self._worker.submit(self._fill, matchers, bits))

    def _fill(self, matchers: list[GrammarMatcher], bits: torch.Tensor) -> None:
        if self._executor is None:
            self._executor = llg.LLExecutor(num_threads=1)  # beside the forward pass's threads, not over them
        self._executor.unsafe_compute_mask_ptr([(m.ll, i) for i, m in enumerate(matchers)], bits.data_ptr(),
                                               self._words * 4, len(matchers))

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True)
