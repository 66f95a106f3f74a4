"""Logit bias and repetition/presence/frequency penalties, batched over the rows that use them.

Semantics (vLLM v1 and OpenAI, applied in this order to the raw logits of a row):

1. ``logit_bias``: ``logits[t] += bias[t]`` for each token id in the request's map.
2. ``repetition_penalty`` r over tokens seen in the prompt *or* the output (HF/vLLM):
   a positive logit is divided by r, a negative one multiplied by r.
3. ``frequency_penalty`` f and ``presence_penalty`` p over *output* tokens (OpenAI):
   ``logits[t] -= f * count[t] + p * (count[t] > 0)``.

State is per request and incremental (``PenaltyState``): a count per vocabulary entry of the
tokens generated so far, caught up with the request's output list at each step in O(new
tokens), plus the prompt's token set (only for a repetition penalty) and the logit bias as
tensors. Only requests whose parameters use a penalty or a bias get a state; only their
rows are gathered and processed; requests without one pay nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from execstate.engine.sampling_params import SamplingParams


class PenaltyState:
    """One request's penalty state: output token counts kept up to date incrementally.

    ``output_token_ids`` is the request's own output list (appended to by the engine after
    each step, never rewritten); ``sync()`` counts only the tokens appended since its last
    call, so the cost per generated token is O(1) whatever the output length. ``seen``
    (prompt or output tokens) exists only for a repetition penalty.
    """

    def __init__(
        self, params: SamplingParams, prompt_token_ids: list[int], output_token_ids: list[int], vocab_size: int
    ) -> None:
        self.vocab_size = vocab_size
        self.repetition = float(params.repetition_penalty)
        self.presence = float(params.presence_penalty)
        self.frequency = float(params.frequency_penalty)
        self._outputs = output_token_ids
        self._num_counted = 0
        self.counts = np.zeros(vocab_size, dtype=np.int32)
        self.seen: np.ndarray | None = None
        if self.repetition != 1.0:
            self.seen = np.zeros(vocab_size, dtype=np.bool_)
            self.seen[np.asarray(prompt_token_ids, dtype=np.int64)] = True
        bias = params.logit_bias or {}
        self.bias_ids = torch.tensor(list(bias.keys()), dtype=torch.long)
        self.bias_values = torch.tensor(list(bias.values()), dtype=torch.float32)

    @classmethod
    def for_request(
        cls, params: SamplingParams, prompt_token_ids: list[int], output_token_ids: list[int], vocab_size: int
    ) -> PenaltyState | None:
        """A state when ``params`` use a penalty or a logit bias, else ``None``."""
        if not params.uses_penalties:
            return None
        return cls(params, prompt_token_ids, output_token_ids, vocab_size)

    @property
    def uses_history(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0

    def sync(self) -> None:
        """Count the output tokens appended since the last call (O(new tokens))."""
        n = len(self._outputs)
        if n > self._num_counted:
            new = np.asarray(self._outputs[self._num_counted : n], dtype=np.int64)
            np.add.at(self.counts, new, 1)
            if self.seen is not None:
                self.seen[new] = True
            self._num_counted = n


def apply_penalties(logits: torch.Tensor, states: list[PenaltyState | None]) -> torch.Tensor:
    """Apply each row's bias and penalties to ``logits`` ([rows, vocab] fp32) in place.

    Row ``i`` uses ``states[i]`` (``None``: untouched). Only rows with a state are gathered
    and processed. Returns ``logits``.
    """
    used = [(i, s) for i, s in enumerate(states) if s is not None]
    if not used:
        return logits
    bad = [s.vocab_size for _, s in used if s.vocab_size != logits.shape[1]]
    if bad:
        raise ValueError(f"penalty state has vocab {bad[0]}, logits have {logits.shape[1]}")
    biased = [(i, s) for i, s in used if len(s.bias_ids)]
    if biased:
        rows = torch.repeat_interleave(
            torch.tensor([i for i, _ in biased]), torch.tensor([len(s.bias_ids) for _, s in biased])
        )
        toks = torch.cat([s.bias_ids for _, s in biased])
        logits.index_put_((rows, toks), torch.cat([s.bias_values for _, s in biased]), accumulate=True)
    hist = [(i, s) for i, s in used if s.uses_history]
    if hist:
        for _, s in hist:
            s.sync()
        idx = torch.tensor([i for i, _ in hist], dtype=torch.long)
        logits[idx] = _apply_history(logits[idx], [s for _, s in hist])
    return logits


def _apply_history(x: torch.Tensor, states: list[PenaltyState]) -> torch.Tensor:
    """vLLM's ``apply_penalties`` on the gathered rows ``x`` (modified and returned)."""
    if any(s.seen is not None for s in states):
        none = np.zeros(x.shape[1], dtype=np.bool_)
        seen = torch.from_numpy(np.stack([s.seen if s.seen is not None else none for s in states]))
        r = torch.where(seen, torch.tensor([s.repetition for s in states], dtype=x.dtype)[:, None], 1.0)
        x = torch.where(x > 0, x / r, x * r)
    if any(s.frequency != 0.0 or s.presence != 0.0 for s in states):
        counts = torch.from_numpy(np.stack([s.counts for s in states])).to(x.dtype)
        frequency = torch.tensor([s.frequency for s in states], dtype=x.dtype)[:, None]
        presence = torch.tensor([s.presence for s in states], dtype=x.dtype)[:, None]
        x = x - (frequency * counts + presence * (counts > 0).to(x.dtype))
    return x
