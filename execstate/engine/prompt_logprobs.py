"""Prompt logprobs (vLLM's ``SamplingParams.prompt_logprobs``), scored chunk by chunk as the prompt
is prefilled: one concept, three parts.

- :func:`score_rows` (the runner, after each forward pass): for every scheduled span of a request
  that asks for them, the logits of the span's prompt positions, log-softmaxed in blocks of
  ``ROWS_PER_BLOCK`` rows, reduced at once to what is kept: each next token's logprob, its rank
  (1 = most likely) and the ``k`` most likely tokens with theirs. Memory per step is one block's
  ``[rows, vocab]``, never the prompt's; the step is bounded by the scheduler (a request that asks
  for prompt logprobs gets at most ``EngineConfig.prompt_logprobs_chunk_tokens`` tokens per step).
- :class:`PromptScoring` (one per such request, ``Request.prompt_scoring``): the rows so far, in
  arrays sized for the prompt when the request is built (``O(n * (k + 1))``), written by position, so
  a preempted request that recomputes its prompt writes the same rows again.
- :class:`PromptLogprobs` (``RequestOutput.prompt_logprobs``): the finished arrays; ``entries()``
  builds vLLM's layout (per prompt token ``None`` for the first, then ``{token: Logprob}`` with the
  token itself and the ``k`` alternatives), which costs Python objects per entry: call it off the
  engine thread (the server does, in a worker).

The logprob of a token is the log-softmax of the fp32 logits at the position before it, as
``LLM.score`` computes it; on execstate's CPU kernels (which compute a row with the same operations
whatever the chunk or batch it is in) the two are equal bit for bit.

A request that asks for prompt logprobs takes no prefix-cache hit (the positions it would skip
have no logits; vLLM does the same): ``KVCacheManager.find_cached_prefix``. Its blocks are cached
as anyone's once computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from execstate.engine.outputs import PromptLogprobs

ROWS_PER_BLOCK = 128  # logits rows materialised at once: 128 x vocab fp32 (25 MB at a 49k vocabulary)


class PromptScoring:
    """The rows of one request's prompt scored so far (module docstring). Engine thread only."""

    def __init__(self, token_ids: list[int], k: int, max_chunk_tokens: int | None = None) -> None:
        rows = max(0, len(token_ids) - 1)
        self.token_ids = token_ids
        self.k = k
        # the most tokens of the request one step may run (None: the step's budget; Request.chunk)
        self.max_chunk_tokens = max_chunk_tokens
        self._logprobs = np.zeros(rows, np.float32)
        self._ranks = np.zeros(rows, np.int64)
        self._top_ids = np.zeros((rows, k), np.int64)
        self._top_logprobs = np.zeros((rows, k), np.float32)
        self._done = np.zeros(rows, np.bool_)

    @property
    def rows_wanted(self) -> int:
        """Prompt positions whose logits are scored: every one but the last token's."""
        return len(self._done)

    def record(self, first: int, logprobs: np.ndarray, ranks: np.ndarray, top_ids: np.ndarray,
               top_logprobs: np.ndarray) -> None:
        """Rows ``first .. first + len(logprobs)`` (scored again after a preemption: the same values)."""
        end = first + len(logprobs)
        self._logprobs[first:end], self._ranks[first:end] = logprobs, ranks
        self._top_ids[first:end], self._top_logprobs[first:end] = top_ids, top_logprobs
        self._done[first:end] = True

    @property
    def complete(self) -> bool:
        return bool(self._done.all())

    def result(self) -> PromptLogprobs:
        """The finished scores; ``RuntimeError`` when a row is missing (a bug: every prompt position is
        computed before the request samples)."""
        if not self.complete:
            raise RuntimeError(f"prompt logprobs: {int((~self._done).sum())} of {self.rows_wanted} rows not scored")
        return PromptLogprobs(self.token_ids, self._logprobs, self._ranks, self._top_ids, self._top_logprobs)


@dataclass(frozen=True)
class Span:
    """A scheduled span of a request that scores its prompt: positions ``start .. start + count`` of
    its sequence, at ``offset`` in the step's flat batch."""

    scoring: PromptScoring
    start: int
    count: int
    offset: int


@dataclass(frozen=True)
class ScoredRows:
    """What :func:`score_rows` found for one span: rows ``first ..`` of its request's prompt."""

    scoring: PromptScoring
    first: int
    logprobs: np.ndarray
    ranks: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray


class _Scheduled(Protocol):
    """A scheduled span (``engine/scheduler.ScheduledRequest``; not imported: the scheduler imports
    the request, which names this module's ``PromptScoring``)."""

    @property
    def request(self) -> Any: ...
    @property
    def num_computed_before(self) -> int: ...
    @property
    def num_new_tokens(self) -> int: ...


def prompt_spans(scheduled: Sequence[_Scheduled], offsets: Sequence[int]) -> list[Span]:
    """The spans of a step whose requests score their prompts; ``offsets``: each span's start in the
    flat batch."""
    return [Span(s.request.prompt_scoring, s.num_computed_before, s.num_new_tokens, offsets[i])
            for i, s in enumerate(scheduled) if s.request.prompt_scoring is not None]


class _LogitsModel(Protocol):
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


@torch.inference_mode()
def score_rows(model: _LogitsModel, hidden: torch.Tensor, spans: list[Span]) -> list[ScoredRows]:
    """The prompt rows of this step's ``spans`` (module docstring); ``hidden``: the forward pass's output."""
    out: list[ScoredRows] = []
    for sp in spans:
        scoring, start = sp.scoring, sp.start
        end = min(start + sp.count, scoring.rows_wanted)  # position p predicts token p + 1
        if start >= end:
            continue
        rows = hidden[sp.offset: sp.offset + (end - start)]
        nxt = torch.tensor(scoring.token_ids[start + 1: end + 1], device=hidden.device)
        parts = [_reduce(model, rows[b: b + ROWS_PER_BLOCK], nxt[b: b + ROWS_PER_BLOCK], scoring.k)
                 for b in range(0, end - start, ROWS_PER_BLOCK)]
        lp, rk, ti, tv = (np.concatenate([p[j] for p in parts]) for j in range(4))
        out.append(ScoredRows(scoring, start, lp, rk, ti, tv))
    return out


def _reduce(model: _LogitsModel, rows: torch.Tensor, nxt: torch.Tensor,
            k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    logp = torch.log_softmax(model.compute_logits(rows).float(), dim=-1)
    chosen = logp.gather(1, nxt[:, None])
    ranks = (logp > chosen).sum(dim=1) + 1
    k = min(k, logp.shape[1])
    top_v, top_i = torch.topk(logp, k, dim=1) if k > 0 else (logp[:, :0], logp[:, :0].long())
    return (chosen.squeeze(1).cpu().numpy(), ranks.cpu().numpy(), top_i.cpu().numpy(), top_v.cpu().numpy())


def record_rows(scored: list[ScoredRows]) -> None:
    """Write a step's scored rows into their requests' scoring (after the forward pass, engine thread)."""
    for r in scored:
        r.scoring.record(r.first, r.logprobs, r.ranks, r.top_ids, r.top_logprobs)
