"""Logit bias and repetition/presence/frequency penalties, batched over the rows that use them.

Semantics (vLLM v1 and OpenAI, applied in this order to the raw logits of a row):

1. ``logit_bias``: ``logits[t] += bias[t]`` for each token id in the request's map.
2. ``repetition_penalty`` r over tokens seen in the prompt *or* the output (HF/vLLM):
   a positive logit is divided by r, a negative one multiplied by r.
3. ``frequency_penalty`` f and ``presence_penalty`` p over *output* tokens (OpenAI):
   ``logits[t] -= f * count[t] + p * (count[t] > 0)``.

State is per request and incremental (``PenaltyState``): a count per vocabulary entry of the
tokens generated so far, caught up with the request's output list at each step in O(new
tokens), and the list of distinct token ids the penalties touch (output tokens; prompt
tokens too for a repetition penalty), in first-seen order. A step gathers, adjusts and
scatters back only those positions, O(distinct tokens) per row (never more than the
vocabulary), instead of whole-vocabulary count tensors. Only requests whose parameters use
a penalty or a bias get a state; requests without one pay nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from execstate.engine.sampling_params import SamplingParams
from execstate.model.device.upload import upload


class _IdList:
    """A growable int64 array (amortised O(1) append; ``view()`` costs nothing)."""

    def __init__(self, capacity: int = 64) -> None:
        self._a = np.empty(max(capacity, 16), dtype=np.int64)
        self.n = 0

    def extend(self, ids: np.ndarray) -> None:
        if self.n + len(ids) > len(self._a):
            self._a = np.resize(self._a, max(2 * len(self._a), self.n + len(ids)))
        self._a[self.n : self.n + len(ids)] = ids
        self.n += len(ids)

    def view(self) -> np.ndarray:
        return self._a[: self.n]


class PenaltyState:
    """One request's penalty state, kept up to date incrementally.

    ``output_token_ids`` is the request's own outputs (a live view, ``Request.output_token_ids``,
    appended to by the engine after each step, never rewritten); ``sync()`` looks only at the
    tokens appended since its last call, so the cost per generated token is O(1) whatever the output length.
    ``positions`` are the distinct token ids the history penalties apply to: output tokens
    and, for a repetition penalty, prompt tokens.
    """

    def __init__(
        self, params: SamplingParams, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int], vocab_size: int
    ) -> None:
        self.vocab_size = vocab_size
        # Clamped into float32's range (the result is the same: such a penalty decides anyway).
        self.repetition = min(max(float(params.repetition_penalty), 1e-30), 1e30)
        self.presence = float(params.presence_penalty)
        self.frequency = float(params.frequency_penalty)
        self._outputs = output_token_ids
        self._num_counted = 0
        self.counts = np.zeros(vocab_size, dtype=np.int32)  # output tokens only
        self._listed = np.zeros(vocab_size, dtype=np.bool_)  # in positions
        self._positions = _IdList()
        if self.repetition != 1.0:
            self._add_positions(np.asarray(prompt_token_ids, dtype=np.int64))
        bias = params.logit_bias or {}
        self.bias_ids = np.asarray(list(bias.keys()), dtype=np.int64)
        self.bias_values = np.asarray(list(bias.values()), dtype=np.float32)

    @classmethod
    def for_request(
        cls, params: SamplingParams, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int], vocab_size: int
    ) -> PenaltyState | None:
        """A state when ``params`` use a penalty or a logit bias, else ``None``."""
        if not params.uses_penalties:
            return None
        return cls(params, prompt_token_ids, output_token_ids, vocab_size)

    @property
    def uses_history(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0

    @property
    def positions(self) -> np.ndarray:
        return self._positions.view()

    def sync(self) -> None:
        """Count the output tokens appended since the last call (O(new tokens))."""
        n = len(self._outputs)
        if n > self._num_counted:
            new = np.asarray(self._outputs[self._num_counted : n], dtype=np.int64)
            np.add.at(self.counts, new, 1)
            self._add_positions(new)
            self._num_counted = n

    def _add_positions(self, ids: np.ndarray) -> None:
        fresh = np.unique(ids[~self._listed[ids]])
        self._listed[fresh] = True
        self._positions.extend(fresh)


def apply_penalties(logits: torch.Tensor, states: list[PenaltyState | None]) -> torch.Tensor:
    """Apply each row's bias and penalties to ``logits`` ([rows, vocab] fp32) in place.

    Row ``i`` uses ``states[i]`` (``None``: untouched). Only rows with a state, and in them
    only the biased ids and the state's ``positions``, are read and written. Returns ``logits``.
    The indices are built on the host and go up without blocking (``logits`` may be on a device).
    """
    used = [(i, s) for i, s in enumerate(states) if s is not None]
    if not used:
        return logits
    bad = [s.vocab_size for _, s in used if s.vocab_size != logits.shape[1]]
    if bad:
        raise ValueError(f"penalty state has vocab {bad[0]}, logits have {logits.shape[1]}")
    biased = [(i, s) for i, s in used if len(s.bias_ids)]
    if biased:
        dev = logits.device
        rows = np.repeat(np.asarray([i for i, _ in biased], dtype=np.int64), [len(s.bias_ids) for _, s in biased])
        toks = np.concatenate([s.bias_ids for _, s in biased])
        values = np.concatenate([s.bias_values for _, s in biased])
        logits.index_put_((upload(rows, dev), upload(toks, dev)), upload(values, dev), accumulate=True)
    hist = [(i, s) for i, s in used if s.uses_history]
    for _, s in hist:
        s.sync()
    hist = [(i, s) for i, s in hist if len(s.positions)]
    if hist:
        _apply_history(logits, [i for i, _ in hist], [s for _, s in hist])
    return logits


def _apply_history(logits: torch.Tensor, rows: list[int], states: list[PenaltyState]) -> None:
    """vLLM's ``apply_penalties`` at each row's positions only (every other logit is unchanged)."""
    dev = logits.device
    lengths = [len(s.positions) for s in states]
    row_idx = upload(np.repeat(np.asarray(rows, dtype=np.int64), lengths), dev)
    tok_idx = upload(np.concatenate([s.positions for s in states]), dev)
    counts = upload(np.concatenate([s.counts[s.positions] for s in states]).astype(np.float32), dev)

    def per_row(values: list[float]) -> torch.Tensor:
        return upload(np.repeat(np.asarray(values, dtype=np.float32), lengths), dev)

    x = logits[row_idx, tok_idx]
    r = per_row([s.repetition for s in states])  # positions are all seen tokens when r != 1
    x = torch.where(x > 0, x / r, x * r)
    x -= per_row([s.frequency for s in states]) * counts + per_row([s.presence for s in states]) * (counts > 0)
    logits[row_idx, tok_idx] = x
