"""Greedy constrained rows: the grammar is asked about the argmax first, the full mask computed
only for the rows whose answer needs it. The tokens are those of the full mask, bit for bit.

A greedy row under a grammar takes the argmax of its logits under the grammar's mask
(``engine/token_mask.py``, ``engine/sampler.py``). llguidance's mask (``LLMatcher``'s
``compute_mask``, which ``unsafe_compute_mask_ptr`` runs; llguidance 1.9.1, pinned) is, per state:

1. the one token ``compute_ff_tokens()[0]`` when the grammar forces bytes that tokenize to
   tokens (``compute_ff_tokens()`` is the list ``compute_mask`` itself computes first; no forced
   byte, ``compute_ff_bytes()`` empty, means no forced token);
2. else, when no byte is forced, the tokens whose bytes the parser accepts now, i.e. those
   ``validate_tokens([t])`` counts, and EOS when the grammar is accepting.

So, with ``t`` the argmax of the row (bans and penalties applied) and ``x`` that row:

- in state 1 the masked argmax is ``f = ff[0]`` whenever ``x[f]`` is not ``-inf`` (every other
  token is ``-inf`` under the mask; a NaN at ``f`` is the argmax too): no mask, no argmax needed;
- in state 2, a non-EOS ``t`` with ``x[t] > -inf`` that ``validate_tokens`` accepts is the masked
  argmax as well: masking only lowers other tokens to ``-inf``, and the first maximum stays first;
- anything else (the argmax refused, EOS, forced bytes without forced tokens, a ``-inf`` row that
  the fallback decides, a stopped matcher) computes the row's full mask as before and takes the
  argmax under it (``apply_token_mask`` with the same fallback).

The one difference from masking every row: a mask computation that exceeds llguidance's per-step
limits (``GrammarBounds``: lexer fuel, Earley items) fails the request only in a step that computes
that row's mask; a row settled without one goes on.

``tests/engine/test_grammar_argmax.py`` checks these facts about llguidance's mask on every token
of many grammar states (JSON schema, regex, choice, Lark; ``tests/embedded/``: the SmolLM2
vocabulary), ``settle`` against the full mask on crafted rows, and the engine's tokens with and
without this path. Cost per row and step: ~1-3 us of grammar calls where no byte is forced, ~11 us
where bytes are forced (llguidance tokenizes them), against ~50-400 us for a mask and its pass
over the logits (the SmolLM2 vocabulary); on the JSON benchmark's workload ~94% of the rows need no
mask.

Threads: the engine thread only, after the forward pass and before the matchers advance
(``StepResults``); the masks it computes drop the GIL (several rows: llguidance's executor, one
thread per core, the forward pass being done).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import llguidance as llg
import numpy as np
import torch

from execstate.engine.grammar.matcher import GrammarMatcher
from execstate.engine.token_mask import TokenMask, apply_token_mask

_NEG_INF = float("-inf")


def compute_masks(executor: llg.LLExecutor | None, matchers: list[GrammarMatcher], bits: torch.Tensor) -> None:
    """Row ``i`` of ``bits`` (int32 ``[len(matchers), words]``, contiguous) becomes the mask of
    ``matchers[i]``: one row on the calling thread, several on ``executor``'s threads."""
    words = bits.shape[1]
    if len(matchers) == 1 or executor is None:
        for i, m in enumerate(matchers):
            m.ll.unsafe_compute_mask_ptr(bits.data_ptr() + 4 * words * i, 4 * words)
        return
    executor.unsafe_compute_mask_ptr([(m.ll, i) for i, m in enumerate(matchers)], bits.data_ptr(), 4 * words,
                                     len(matchers))


@dataclass
class ArgmaxCounts:
    """Greedy constrained rows settled so far, by how: the grammar forced the token, it accepted
    the argmax, or the row needed its full mask."""

    forced: int = 0
    accepted: int = 0
    masked: int = 0


class ArgmaxFirst:
    """The greedy constrained rows of one step (``rows``: logits rows, ``matchers``: theirs);
    ``settle`` is ``engine/token_mask.py``'s ``DeferredMask``; ``counts`` adds up how each row went."""

    def __init__(self, rows: list[int], matchers: list[GrammarMatcher], words: int, eos: frozenset[int],
                 executor: GreedyExecutor, counts: ArgmaxCounts) -> None:
        self.rows = rows
        self.matchers = matchers
        self._words = words
        self._eos = eos
        self._executor = executor
        self._counts = counts

    def settle(self, x: torch.Tensor, fallback: torch.Tensor, tokens: torch.Tensor) -> None:
        """``tokens[r]`` (the argmax of ``x[r]``) becomes the argmax of ``x[r]`` under row r's mask,
        for each row r of this step (module docstring); ``x`` and ``fallback`` are not changed."""
        picks = tokens.tolist()
        known: list[int] = []  # indices into rows whose token the grammar gave without a mask
        cands: list[int] = []
        forced: list[bool] = []
        need: list[int] = []
        for i, (r, m) in enumerate(zip(self.rows, self.matchers, strict=True)):
            ll = m.ll
            if ll.is_stopped():  # also a matcher in error: its mask is EOS alone
                need.append(i)
                continue
            ff = ll.compute_ff_tokens() if ll.compute_ff_bytes() else None  # no forced byte, no forced token
            t = ff[0] if ff else picks[r]
            if ff or (ff is None and t not in self._eos and ll.validate_tokens([t]) == 1):
                known.append(i)
                cands.append(t)
                forced.append(bool(ff))
            else:
                need.append(i)
        counts = self._counts
        xs, out = x.numpy(), tokens.numpy()  # element access through numpy: ~0.1 us, through torch ~3 us
        for i, t, f in zip(known, cands, forced, strict=True):
            r = self.rows[i]
            if xs[r, t] == _NEG_INF:  # the row is all -inf (or, forced, the token banned): the full mask decides
                need.append(i)
                continue
            if f:
                counts.forced += 1
            else:
                counts.accepted += 1
            out[r] = t
        counts.masked += len(need)
        if not need:
            return
        need.sort()
        bits = torch.empty((len(need), self._words), dtype=torch.int32)
        compute_masks(self._executor.get() if len(need) > 1 else None, [self.matchers[i] for i in need], bits)
        # numpy's copies and argmax: one thread, where torch's ops over a vocabulary would fork its team
        rows = np.asarray([self.rows[i] for i in need], dtype=np.int64)
        sub = xs[rows]
        apply_token_mask(torch.from_numpy(sub), TokenMask(torch.arange(len(need)), bits),
                         fallback=torch.from_numpy(fallback.numpy()[rows]))
        out[rows] = np.argmax(sub, axis=-1)


class GreedyExecutor:
    """llguidance's executor for the masks ``ArgmaxFirst`` computes after the forward pass: one
    thread per core, at most 32 (the kernels' team is idle then), built on first use."""

    def __init__(self) -> None:
        self._executor: llg.LLExecutor | None = None

    def get(self) -> llg.LLExecutor:
        if self._executor is None:
            self._executor = llg.LLExecutor(num_threads=min(32, os.cpu_count() or 1))
        return self._executor
