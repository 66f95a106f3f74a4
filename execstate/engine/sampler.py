"""Token sampling for one step's logits rows, vectorised over the batch (vLLM v1's design).

Pipeline, as batched tensor ops with per-row parameter tensors (no per-row Python loop
except one noise draw per *seeded* row):

1. ``logit_bias``, the ``banned`` ids (``min_tokens``) and the repetition / presence /
   frequency penalties (``engine/penalties.py``) adjust the logits of the rows that use them;
   then a grammar's ``mask`` (``engine/token_mask.py``) sets the tokens it does not allow to
   ``-inf`` in the rows it constrains (only those rows are touched; none without a mask).
2. Greedy rows (temperature < 1e-5) take the argmax of the adjusted logits; greedy rows under a
   grammar whose masks were ``deferred`` (``engine/grammar_argmax.py``) then get the argmax under
   their masks from ``deferred.settle``, computed only where the grammar refuses the argmax.
3. Random rows: temperature, then ``min_p``, then ``top_k``, then ``top_p`` (vLLM v1's
   order and semantics, ties at a cut kept; ``processed_probs``), without a full-vocabulary
   sort, then one token per row by the exponential race ``argmax(probs / q)``,
   ``q ~ Exp(1)`` i.i.d. per token, which samples exactly from ``probs``. A seeded row draws
   its noise from its own ``torch.Generator`` (one call per seeded row, a whole vocabulary
   row every step), so its tokens do not depend on its batch mates; unseeded rows share one
   batched draw per generator (normally the engine's).

Logprobs are those of the raw model distribution (log-softmax of the logits before any of
the above), as vLLM reports by default; ``top_logprobs`` likewise.

Device: everything runs where ``logits`` are (the torch path keeps them on its device). Per-row
parameters go up without blocking (``model/device/upload.py``) and the results come back in one
read (sampled ids, their logprobs and the top logprobs packed into one tensor): the step's one
device-to-host synchronisation. With ``device_algorithms`` (by default off the CPU; the torch
path asks for them everywhere), ``top_p`` sorts the whole row
at once (the same threshold, no loop that reads back), and the race's noise is counter-based
(``engine/device_noise.py``): each row draws one 62-bit key per step from its generator (its own
when seeded, on the host: no device state) and the noise of token ``t`` is a hash of (key, t),
so a seeded request stays reproducible and independent of its batch mates on a GPU too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from execstate.engine.device_noise import race_hashed, race_keys
from execstate.engine.penalties import PenaltyState, apply_penalties
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.token_mask import DeferredMask, TokenMask, apply_token_mask
from execstate.model.device.upload import upload

MAX_TEMPERATURE = 1e30  # larger ones sample uniformly anyway; beyond float32 they would give NaN


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
    mask: TokenMask | None = None,
    device_algorithms: bool | None = None,
    deferred: DeferredMask | None = None,
) -> SampleResult:
    """Sample one token per row of ``logits`` ([rows, vocab]).

    ``banned[i]`` token ids get zero probability (``min_tokens``: EOS/stop ids are banned
    until reached); ``penalties[i]`` is row i's bias/penalty state (``None``: none).
    ``generators[i]`` is row i's generator (its own when ``params[i].seed`` is set).
    ``mask``: the allowed tokens of the constrained rows (``None``: no row is constrained).
    ``deferred``: greedy constrained rows (none of ``mask``'s) masked only where needed.
    ``device_algorithms``: take the device's ``top_p`` and noise (module docstring) even on the
    CPU (the torch path does, so its CPU runs are the GPU's code); None: off the CPU only.
    """
    dev_algo = logits.device.type != "cpu" if device_algorithms is None else device_algorithms
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    x = adjust_logits(logits, banned, penalties)
    if mask is not None:
        if x is logits:
            x = logits.clone()
        apply_token_mask(x, mask, fallback=logits)
    rand = [i for i, p in enumerate(params) if not p.greedy]
    if len(rand) == len(params):
        tokens = _race(_truncated(x, params, dev_algo), params, generators, dev_algo)
    else:
        tokens = torch.argmax(x, dim=-1)
        if deferred is not None:
            deferred.settle(x, logits, tokens)
        if rand:
            rparams = [params[i] for i in rand]
            idx = upload(np.asarray(rand, dtype=np.int64), x.device)
            tokens[idx] = _race(_truncated(x[idx], rparams, dev_algo), rparams, [generators[i] for i in rand], dev_algo)
    return _read_back(tokens, logp, params)


def _read_back(tokens: torch.Tensor, logp: torch.Tensor, params: list[SamplingParams]) -> SampleResult:
    """Sampled ids, their logprobs and the top logprobs in ONE device-to-host read: packed into
    one float64 tensor (token ids are exact in float64, and a float32 logprob widened to float64
    is the Python float ``tolist`` would give)."""
    chosen = logp.gather(1, tokens[:, None])
    want = min(max((p.logprobs or 0) for p in params), logp.shape[1])
    cols = [tokens[:, None].double(), chosen.double()]
    if want:
        vals, ids = torch.topk(logp, want, dim=-1)
        cols += [vals.double(), ids.double()]
    rows = torch.cat(cols, dim=1).tolist()  # the one read
    token_ids = [int(r[0]) for r in rows]
    top = [
        list(zip((int(t) for t in r[2 + want : 2 + want + min(p.logprobs, want)]), r[2 : 2 + min(p.logprobs, want)],
                 strict=True))
        if want and p.logprobs else []
        for r, p in zip(rows, params, strict=True)
    ]
    return SampleResult(token_ids, [r[1] for r in rows], top)


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
        rows = np.asarray([i for i, ids in enumerate(banned) for _ in ids], dtype=np.int64)
        cols = np.asarray([t for ids in banned for t in ids], dtype=np.int64)
        x[upload(rows, x.device), upload(cols, x.device)] = float("-inf")
    return x


def processed_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each (non-greedy) row samples from: temperature, then ``min_p``, then
    ``top_k``, then ``top_p`` (each on what the previous ones kept; ties at a cut are kept)."""
    probs = _truncated(logits, params)
    return probs / probs.sum(dim=-1, keepdim=True)


def _truncated(logits: torch.Tensor, params: list[SamplingParams], dev_algo: bool = False) -> torch.Tensor:
    """``processed_probs`` up to a positive factor per row (what the race needs).

    Every step is an elementwise op, a row-wise softmax or a ``topk`` whose *values* it
    uses, so a row's result does not depend on the other rows (seeded batch invariance).
    No full-vocabulary sort: ``top_p`` looks only at as many of the most likely tokens as
    needed to reach the mass (``_top_p_threshold``).
    """
    vocab = logits.shape[1]
    dev = logits.device
    temp = _per_row([min(p.temperature, MAX_TEMPERATURE) for p in params], np.float32, dev)
    x = logits / temp[:, None]  # a new tensor: the masks below work in place
    # A tiny temperature over large (penalised) logits can overflow to +inf, and a softmax
    # over +inf is NaN: keep such tokens as the largest finite value (they stay the likeliest).
    torch.nan_to_num_(x, nan=float("-inf"), posinf=torch.finfo(x.dtype).max, neginf=float("-inf"))
    if any(p.min_p > 0.0 for p in params):
        min_p = _per_row([p.min_p for p in params], np.float32, dev)
        probs = torch.softmax(x, dim=-1)
        x.masked_fill_(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), float("-inf"))
    if any(p.top_k is not None and p.top_k < vocab for p in params):
        ks = [min(p.top_k or vocab, vocab) for p in params]
        k = _per_row(ks, np.int64, dev)
        kth = torch.topk(x, max(ks), dim=-1).values.gather(1, (k - 1)[:, None])
        x.masked_fill_(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if any(p.top_p < 1.0 for p in params):
        top_p = _per_row([p.top_p for p in params], np.float64, dev)
        probs.masked_fill_(probs < _top_p_threshold(probs, top_p, dev_algo), 0.0)
    return probs


def _top_p_threshold(probs: torch.Tensor, top_p: torch.Tensor, whole_row: bool = False) -> torch.Tensor:
    """Per row, the smallest probability kept by ``top_p`` ([rows, 1]): the smallest set of
    most likely tokens whose mass reaches ``top_p`` (a token is kept while the mass of the
    tokens above it is below ``top_p``; the most likely token always stays).

    Looks at the ``n`` largest probabilities, ``n`` growing from 64 until every row has
    reached its mass (peaked distributions stop early). A row's answer does not depend on
    ``n``: the exclusive cumulative mass is a prefix sum (accumulated in double) over the
    row's sorted values, and positions past the cut never count.
    """
    vocab = probs.shape[1]
    n = vocab if whole_row else min(64, vocab)  # whole_row: one sort, no read-back
    while True:
        vals = torch.topk(probs, n, dim=-1).values
        excl = vals.double().cumsum(dim=-1) - vals.double()
        if n == vocab or bool(((excl[:, -1] >= top_p) | (top_p >= 1.0)).all()):
            break
        n = min(vocab, n * 8)
    keep = (excl < top_p[:, None]).sum(dim=-1).clamp_(min=1)
    return torch.where(top_p[:, None] < 1.0, vals.gather(1, (keep - 1)[:, None]), 0.0)


def _race(probs: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
          hashed: bool = False) -> torch.Tensor:
    """One token per row: ``argmax(probs / q)`` with ``q ~ Exp(1)`` (an exact sample of ``probs``).

    ``q = -log(u)``, ``u ~ U(0, 1)`` (several times cheaper than ``exponential_`` on CPU);
    ``u`` is clamped away from 0 so ``q`` is finite and a zero-probability token never wins.
    Seeded rows draw ``u`` from their own generator (one call each), the others share one
    batched draw per generator. ``hashed``: the device's counter-based noise (module docstring).
    """
    if hashed:
        return race_hashed(probs, upload(race_keys(params, generators), probs.device))
    u = torch.empty_like(probs)
    shared: dict[int, tuple[torch.Generator | None, list[int]]] = {}
    for i, (p, g) in enumerate(zip(params, generators, strict=True)):
        if p.seed is None:
            shared.setdefault(id(g), (g, []))[1].append(i)
    for gen, rows in shared.values():
        if len(rows) == len(params):
            u.uniform_(generator=gen)
        else:
            u[torch.tensor(rows, dtype=torch.long)] = torch.rand(len(rows), u.shape[1], generator=gen)
    for i, p in enumerate(params):  # seeded rows only: each from its own generator
        if p.seed is not None:
            u[i].uniform_(generator=generators[i])
    q = u.clamp_min_(torch.finfo(u.dtype).tiny).log_().neg_()
    return probs.div_(q).argmax(dim=-1)


def _per_row(values: list[float] | list[int], dtype: type, device: torch.device) -> torch.Tensor:
    """One value per row as a tensor on ``device`` (uploaded without blocking)."""
    return upload(np.asarray(values, dtype=dtype), device)
