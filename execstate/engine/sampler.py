"""Token sampling for one step's logits rows, vectorised over the batch (vLLM v1's design).

Pipeline, as batched tensor ops with per-row parameter tensors (no per-row Python loop
except one noise draw per *seeded* row):

1. ``logit_bias``, the ``banned`` ids (``min_tokens``) and the repetition / presence /
   frequency penalties (``engine/penalties.py``) adjust the logits of the rows that use them.
2. Greedy rows (temperature < 1e-5) take the argmax of the adjusted logits.
3. Random rows: temperature, then ``min_p``, then ``top_k``, then ``top_p`` (vLLM v1's
   order; ``processed_probs``), then one token per row by the exponential race
   ``argmax(probs / q)``, ``q ~ Exp(1)``, which samples exactly from ``probs``.
   A seeded row draws its ``q`` from its own ``torch.Generator`` (one call per seeded row),
   so its tokens do not depend on its batch mates; unseeded rows share one batched draw per
   generator (normally the engine's).

Logprobs are those of the raw model distribution (log-softmax of the logits before any of
the above), as vLLM reports by default; ``top_logprobs`` likewise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from execstate.engine.penalties import PenaltyState, apply_penalties
from execstate.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]  # empty list per row when not requested


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    banned: list[list[int]] | None = None,
    penalties: list[PenaltyState | None] | None = None,
) -> SampleResult:
    """Sample one token per row of ``logits`` ([rows, vocab]).

    ``banned[i]`` token ids get zero probability (``min_tokens``: EOS/stop ids are banned
    until reached); ``penalties[i]`` is row i's bias/penalty state (``None``: none).
    ``generators[i]`` is row i's generator (its own when ``params[i].seed`` is set).
    """
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    x = adjust_logits(logits, banned, penalties)
    tokens = torch.argmax(x, dim=-1)
    rand = [i for i, p in enumerate(params) if not p.greedy]
    if rand:
        rparams = [params[i] for i in rand]
        if len(rand) == len(params):
            tokens = _race(processed_probs(x, rparams), rparams, generators)
        else:
            idx = torch.tensor(rand, dtype=torch.long)
            tokens[idx] = _race(processed_probs(x[idx], rparams), rparams, [generators[i] for i in rand])
    chosen = logp.gather(1, tokens[:, None]).squeeze(1).tolist()
    return SampleResult(tokens.tolist(), chosen, _top_logprobs(logp, params))


def adjust_logits(
    logits: torch.Tensor, banned: list[list[int]] | None = None, penalties: list[PenaltyState | None] | None = None
) -> torch.Tensor:
    """Bias, bans and penalties applied to a copy of ``logits`` (``logits`` itself when none apply)."""
    has_penalties = penalties is not None and any(s is not None for s in penalties)
    has_bans = banned is not None and any(banned)
    if not (has_penalties or has_bans):
        return logits
    x = logits.clone()
    if has_penalties:
        assert penalties is not None
        apply_penalties(x, penalties)
    if has_bans:
        assert banned is not None
        rows = [i for i, ids in enumerate(banned) for _ in ids]
        cols = [t for ids in banned for t in ids]
        x[torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)] = float("-inf")
    return x


def processed_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each (non-greedy) row samples from: temperature, min_p, top_k, top_p."""
    vocab = logits.shape[1]
    temp = torch.tensor([p.temperature for p in params], dtype=logits.dtype)
    x = logits / temp[:, None]
    if any(p.min_p > 0.0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], dtype=x.dtype)
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), float("-inf"))
    k = None
    if any(p.top_k is not None and p.top_k < vocab for p in params):
        k = torch.tensor([min(p.top_k or vocab, vocab) for p in params], dtype=torch.long)
    top_p = torch.tensor([p.top_p for p in params], dtype=x.dtype) if any(p.top_p < 1.0 for p in params) else None
    return torch.softmax(_top_k_top_p(x, k, top_p), dim=-1)


def _top_k_top_p(x: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top ``k`` and then outside the smallest set
    of most likely tokens whose probability reaches ``p`` (vLLM's ``apply_top_k_top_p``;
    ties at the k-th value are kept)."""
    if p is None:
        if k is None:
            return x
        kth = torch.topk(x, int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])
        return x.masked_fill(x < kth, float("-inf"))
    x_sort, order = x.sort(dim=-1, descending=False)
    if k is not None:
        kth = x_sort.gather(1, (x.shape[1] - k)[:, None])
        x_sort = x_sort.masked_fill(x_sort < kth, float("-inf"))
    cum = torch.softmax(x_sort, dim=-1).cumsum(dim=-1)
    drop = cum <= 1.0 - p[:, None]  # the mass of this token and all less likely ones
    drop[:, -1] = False  # the most likely token always stays
    x_sort = x_sort.masked_fill(drop, float("-inf"))
    return x_sort.scatter(1, order, x_sort)


def _race(probs: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row: ``argmax(probs / q)`` with ``q ~ Exp(1)`` (an exact sample of ``probs``)."""
    q = torch.empty_like(probs)
    shared: dict[int, tuple[torch.Generator | None, list[int]]] = {}
    for i, (p, g) in enumerate(zip(params, generators, strict=True)):
        if p.seed is None:
            shared.setdefault(id(g), (g, []))[1].append(i)
    for gen, rows in shared.values():
        if len(rows) == len(params):
            q.exponential_(generator=gen)
        else:
            q[torch.tensor(rows, dtype=torch.long)] = torch.empty(len(rows), q.shape[1]).exponential_(generator=gen)
    for i, p in enumerate(params):  # seeded rows only: each from its own generator
        if p.seed is not None:
            q[i].exponential_(generator=generators[i])
    return probs.div_(q).argmax(dim=-1)


def _top_logprobs(logp: torch.Tensor, params: list[SamplingParams]) -> list[list[tuple[int, float]]]:
    want = max((p.logprobs or 0) for p in params)
    if want == 0:
        return [[] for _ in params]
    vals, ids = torch.topk(logp, min(want, logp.shape[1]), dim=-1)
    vals_l, ids_l = vals.tolist(), ids.tolist()
    return [
        list(zip(ids_l[i][: p.logprobs], vals_l[i][: p.logprobs], strict=True)) if p.logprobs else []
        for i, p in enumerate(params)
    ]
