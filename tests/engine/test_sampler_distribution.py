"""The sampler samples from the exact distribution its parameters define (chi-square).

Each case draws N tokens from hand-made logits with fixed seeds (deterministic) and runs
Pearson's chi-square goodness-of-fit test (scipy.stats.chisquare) against the float64
reference of ``sampler_oracle.exact_distribution``: the fit must not be rejected at
alpha = 0.001, and tokens outside the support must never be drawn. Each test also shows
that it can fail: the same samples *reject* a nearby wrong distribution (p < 1e-6).
Both paths are covered: unseeded rows (one batched noise draw) and seeded rows (one
generator per row).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sampler_oracle import exact_distribution
from scipy.stats import chisquare

from execstate.engine.sampler import sample
from execstate.engine.sampling_params import SamplingParams

N = 20_000
LOGITS = [0.7, -1.0, 2.0, 0.2, 1.5, -2.2, 1.1, -0.3]  # no ties; most likely token is 2, then 4, 6, 0


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of the counts under ``probs``; 0 when a zero-probability token was drawn."""
    if counts[probs == 0].any():
        return 0.0
    support = probs > 0
    if support.sum() == 1:
        return 1.0
    return float(chisquare(counts[support], probs[support] * counts.sum()).pvalue)


def draw(params: SamplingParams, seeded: bool) -> np.ndarray:
    logits = torch.tensor([LOGITS], dtype=torch.float32).expand(N, -1)
    if seeded:
        plist = [SamplingParams(**{**_kw(params), "seed": 1000 + i}) for i in range(N)]
        gens = [torch.Generator().manual_seed(1000 + i) for i in range(N)]
    else:
        plist = [params] * N
        gens = [torch.Generator().manual_seed(7)] * N
    tokens = sample(logits, plist, gens).token_ids
    return np.bincount(tokens, minlength=len(LOGITS))


def _kw(p: SamplingParams) -> dict:
    return dict(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p)


CASES = {
    "temperature": (dict(temperature=0.7), dict(temperature=1.0)),
    "top_k": (dict(top_k=3), dict(top_k=4)),
    "top_p": (dict(top_p=0.8), dict(top_p=0.95)),
    "min_p": (dict(min_p=0.15), dict(min_p=0.05)),
    # min_p (before top_p, as in vLLM v1) drops 1, 5, 7, so top_p then keeps 4 tokens, not 5
    "combined": (dict(temperature=1.3, top_k=6, top_p=0.88, min_p=0.2), dict(temperature=1.3, top_k=6, top_p=0.88)),
    "combined_temperature": (
        dict(temperature=1.3, top_k=4, top_p=0.8, min_p=0.2), dict(temperature=0.9, top_k=4, top_p=0.8, min_p=0.2)
    ),
}


@pytest.mark.parametrize("seeded", [False, True], ids=["batched", "seeded"])
@pytest.mark.parametrize("case", list(CASES))
def test_sampled_frequencies_fit_the_exact_distribution(case: str, seeded: bool) -> None:
    right, wrong = CASES[case]
    counts = draw(SamplingParams(**right), seeded)
    expected = exact_distribution(LOGITS, **right)
    p = chi2_pvalue(counts, expected)
    assert p > 1e-3, f"{case}: counts {counts.tolist()} vs expected {np.round(expected * N).tolist()} (p={p:.2e})"
    assert (counts[expected == 0] == 0).all()
    # the test can fail: a nearby wrong distribution is rejected by the same samples
    assert chi2_pvalue(counts, exact_distribution(LOGITS, **wrong)) < 1e-6


def test_supports_of_the_cases_are_what_the_parameters_say() -> None:
    """Sanity of the oracle on this logits vector (sorted: 2, 4, 6, 0, 3, 7, 1, 5)."""
    assert set(np.flatnonzero(exact_distribution(LOGITS, top_k=3))) == {2, 4, 6}
    p = exact_distribution(LOGITS)
    mass = np.cumsum(p[[2, 4, 6, 0, 3]])
    assert mass[2] < 0.8 <= mass[3]  # top_p=0.8 keeps 4 tokens
    assert set(np.flatnonzero(exact_distribution(LOGITS, top_p=0.8))) == {2, 4, 6, 0}
    assert set(np.flatnonzero(exact_distribution(LOGITS, min_p=0.15))) == {i for i in range(8) if p[i] >= 0.15 * p[2]}
    assert set(np.flatnonzero(exact_distribution(LOGITS, temperature=1.3, min_p=0.2))) == {0, 2, 3, 4, 6}
    assert set(np.flatnonzero(exact_distribution(LOGITS, **CASES["combined"][0]))) == {0, 2, 4, 6}
    assert set(np.flatnonzero(exact_distribution(LOGITS, **CASES["combined"][1]))) == {0, 2, 3, 4, 6}
    assert set(np.flatnonzero(exact_distribution(LOGITS, **CASES["combined_temperature"][0]))) == {2, 4, 6}


def test_chi2_rejects_a_biased_sampler() -> None:
    """The statistic itself: counts drawn from a slightly different distribution fail."""
    probs = exact_distribution(LOGITS, temperature=0.7)
    biased = probs ** 1.1 / (probs ** 1.1).sum()
    counts = np.random.default_rng(0).multinomial(N, biased)
    assert chi2_pvalue(counts, probs) < 1e-3
    assert chi2_pvalue(np.random.default_rng(0).multinomial(N, probs), probs) > 1e-3
