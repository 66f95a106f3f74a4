"""The token masks of a step's constrained rows: computed while the forward pass runs, or, for
greedy rows on the host, only where the grammar refuses the argmax (``engine/grammar_argmax.py``).

Call order (``LLMEngine`` on the engine thread, once per step):

1. ``start(sched)`` after scheduling, before the forward pass: for every scheduled request that
   samples this step and has a grammar matcher (``Request.grammar``): a greedy row, when
   ``defer_greedy`` (the logits are on the host), goes to an :class:`ArgmaxFirst` and nothing is
   computed for it yet; any other row's mask is computed into one int32 bitmask tensor on a
   worker thread (llguidance's executor, the GIL dropped), so it overlaps the forward pass;
   ``None`` when no sampling row is constrained (nothing is started). While
   ``PendingMask.busy()`` (a worker computing) the forward pass's kernels run on one thread fewer
   (``kernels/team.py``), so the worker has a core instead of descheduling a kernel thread that
   its partner then waits for at every barrier.
2. the forward pass (``ModelRunner.execute``);
3. ``PendingMask.wait()`` before sampling: a :class:`StepMasks`, the worker's :class:`TokenMask`
   for ``engine/sampler.py`` (rows numbered as the logits rows: the sampling rows in scheduled
   order) and the deferred greedy rows, which the sampler settles after its argmax. An error in
   the worker is raised here and fails the step like any step error.

Matchers are read by the worker between 1 and 3, by the deferred rows during sampling, and
advanced only after sampling (``StepResults``), on the engine thread: no matcher changes while its
mask is computed. A greedy row's tokens are the same either way (``engine/grammar_argmax.py``).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import llguidance as llg
import torch

from execstate.engine.grammar.matcher import GrammarMatcher
from execstate.engine.grammar_argmax import ArgmaxCounts, ArgmaxFirst, GreedyExecutor, compute_masks
from execstate.engine.scheduler import SchedulerOutput
from execstate.engine.token_mask import TokenMask


@dataclass(frozen=True)
class StepMasks:
    mask: TokenMask | None  # the rows whose masks were computed beside the forward pass
    deferred: ArgmaxFirst | None  # greedy rows masked only where needed


class PendingMask:
    def __init__(self, rows: list[int], bits: torch.Tensor | None, done: Future[None] | None,
                 deferred: ArgmaxFirst | None) -> None:
        self._rows = rows
        self._bits = bits
        self._done = done
        self._deferred = deferred

    def busy(self) -> bool:
        """Whether the worker is still computing (the forward pass lends it a thread meanwhile)."""
        return self._done is not None and not self._done.done()

    def wait(self) -> StepMasks:
        if self._done is None or self._bits is None:
            return StepMasks(None, self._deferred)
        self._done.result()
        return StepMasks(TokenMask(torch.tensor(self._rows, dtype=torch.long), self._bits), self._deferred)


class GrammarMasks:
    """``defer_greedy``: greedy rows take the argmax-first path (the logits are on the host, where
    reading a row's argmax costs nothing); ``eos_token_ids``: the model's, which that path leaves
    to the full mask. ``argmax_counts``: how the deferred rows were settled so far."""

    def __init__(self, vocab_size: int, eos_token_ids: set[int] | frozenset[int] = frozenset(),
                 defer_greedy: bool = False) -> None:
        self._words = (vocab_size + 31) // 32
        self._eos = frozenset(eos_token_ids)
        self._defer = defer_greedy
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")  # threads start on first use
        self._executor: llg.LLExecutor | None = None
        self._greedy = GreedyExecutor()
        self.argmax_counts = ArgmaxCounts()

    def start(self, sched: SchedulerOutput) -> PendingMask | None:
        rows: list[int] = []
        matchers: list[GrammarMatcher] = []
        greedy_rows: list[int] = []
        greedy: list[GrammarMatcher] = []
        j = 0
        for s in sched.scheduled:
            if s.samples:
                g = s.request.grammar
                if g is not None:
                    if self._defer and s.request.params.greedy:
                        greedy_rows.append(j)
                        greedy.append(g)
                    else:
                        rows.append(j)
                        matchers.append(g)
                j += 1
        if not matchers and not greedy:
            return None
        deferred = (ArgmaxFirst(greedy_rows, greedy, self._words, self._eos, self._greedy, self.argmax_counts)
                    if greedy else None)
        if not matchers:
            return PendingMask([], None, None, deferred)
        bits = torch.empty((len(matchers), self._words), dtype=torch.int32)
        return PendingMask(rows, bits, self._worker.submit(self._fill, matchers, bits), deferred)

    def _fill(self, matchers: list[GrammarMatcher], bits: torch.Tensor) -> None:
        if self._executor is None:
            self._executor = llg.LLExecutor(num_threads=1)  # beside the forward pass's threads, not over them
        compute_masks(self._executor, matchers, bits)

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True)
