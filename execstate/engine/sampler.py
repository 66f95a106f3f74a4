"""Token sampling for one step's logits rows.

Logprobs are those of the raw model distribution (log-softmax of the logits before
temperature/top-k/top-p), as vLLM reports by default. Greedy rows take the argmax;
random rows sample from the processed distribution with the request's own
``torch.Generator`` (seeded requests are reproducible regardless of batch mates).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from execstate.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]  # empty list per row when not requested


def _process(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to one row; returns probabilities."""
    x = logits / p.temperature
    if p.top_k is not None and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = (cum - sorted_p) > p.top_p  # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return probs


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    banned: list[list[int]] | None = None,
) -> SampleResult:
    """Sample one token per row. ``banned[i]`` token ids get zero probability
    (used for ``min_tokens``: EOS/stop ids are banned until reached)."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    if banned is not None and any(banned):
        logits = logits.clone()
        for i, ids in enumerate(banned):
            if ids:
                logits[i, ids] = float("-inf")
    greedy_ids = torch.argmax(logits, dim=-1).tolist()
    tokens: list[int] = []
    for i, p in enumerate(params):
        if p.greedy:
            tokens.append(greedy_ids[i])
        else:
            probs = _process(logits[i], p)
            tokens.append(int(torch.multinomial(probs, 1, generator=generators[i]).item()))
    tok = torch.tensor(tokens, dtype=torch.long)
    chosen = logp.gather(1, tok[:, None]).squeeze(1).tolist()
    tops: list[list[tuple[int, float]]] = []
    want = max((p.logprobs or 0) for p in params)
    top_vals = top_ids = None
    if want > 0:
        top_vals, top_ids = torch.topk(logp, want, dim=-1)
    for i, p in enumerate(params):
        if p.logprobs and top_vals is not None and top_ids is not None:
            tops.append(list(zip(top_ids[i, : p.logprobs].tolist(), top_vals[i, : p.logprobs].tolist(), strict=True)))
        else:
            tops.append([])
    return SampleResult(tokens, chosen, tops)
