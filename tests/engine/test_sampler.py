"""Sampler contract on hand-made logits: masks, greedy, seeded batch invariance, logprobs,
and (hypothesis) any valid SamplingParams samples a token in range, invalid ones raise
ValueError naming the field."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sampler_oracle import exact_distribution

from execstate.engine.penalties import PenaltyState
from execstate.engine.sampler import adjust_logits, processed_probs, sample
from execstate.engine.sampling_params import SamplingParams

V = 50


def random_params(rng: np.random.Generator) -> dict:
    kw: dict = {"temperature": float(rng.choice([0.5, 1.0, 1.7]))}
    if rng.random() < 0.5:
        kw["top_k"] = int(rng.integers(1, V + 3))
    if rng.random() < 0.5:
        kw["top_p"] = float(rng.uniform(0.05, 1.0))
    if rng.random() < 0.5:
        kw["min_p"] = float(rng.uniform(0.0, 0.5))
    return kw


def test_processed_distribution_matches_the_oracle_row_by_row() -> None:
    """A batch of 64 rows, each with its own temperature/top_k/top_p/min_p: every row's
    processed distribution keeps exactly the oracle's tokens, with its probabilities."""
    rng = np.random.default_rng(0)
    logits = torch.from_numpy(rng.normal(0, 2.0, (64, V)).astype(np.float32))
    kws = [random_params(rng) for _ in range(64)]
    probs = processed_probs(logits, [SamplingParams(**kw) for kw in kws]).double().numpy()
    for i, kw in enumerate(kws):
        ref = exact_distribution(logits[i].double().numpy(), **kw)
        assert set(np.flatnonzero(probs[i])) == set(np.flatnonzero(ref)), (i, kw)
        np.testing.assert_allclose(probs[i], ref, atol=2e-6)


def test_top_p_over_a_flat_distribution_needs_thousands_of_tokens() -> None:
    """``top_p`` looks at a growing prefix of the most likely tokens (64, 512, 4096, ...):
    a flat row needs most of the vocabulary, a peaked one a few tokens; in one batch each
    row still gets exactly the oracle's set."""
    rng = np.random.default_rng(4)
    vocab = 6000
    flat = rng.normal(0, 0.1, vocab)
    peaked = rng.normal(0, 6.0, vocab)
    logits = torch.from_numpy(np.stack([flat, peaked, flat]).astype(np.float32))
    kws = [dict(top_p=0.9), dict(top_p=0.9), dict(top_p=0.3, top_k=4000)]
    probs = processed_probs(logits, [SamplingParams(**kw) for kw in kws]).double().numpy()
    for i, kw in enumerate(kws):
        ref = exact_distribution(logits[i].double().numpy(), **kw)
        assert set(np.flatnonzero(probs[i])) == set(np.flatnonzero(ref))
    assert 4096 < (probs[0] > 0).sum() < vocab and (probs[1] > 0).sum() <= 64
    alone = processed_probs(logits[1:2], [SamplingParams(top_p=0.9)])
    assert torch.equal(alone[0], torch.from_numpy(probs[1]).float())  # mates do not change a row


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0), dict(top_k=1, top_p=0.01)])
def test_filters_that_keep_only_the_most_likely_token(kw: dict) -> None:
    logits = torch.from_numpy(np.random.default_rng(1).normal(0, 1, (8, V)).astype(np.float32))
    probs = processed_probs(logits, [SamplingParams(**kw)] * 8)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), V).float())


def test_top_k_keeps_ties_and_larger_than_vocab_is_off() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 2.0]])
    assert (processed_probs(logits, [SamplingParams(top_k=1)])[0] > 0).tolist() == [False, True, True, False, False]
    full = processed_probs(logits, [SamplingParams(top_k=1000)])
    assert torch.allclose(full, torch.softmax(logits, -1))


@pytest.mark.parametrize("temperature", [0.0, 1e-40, 1e-6, 9.99e-6])
def test_temperature_below_1e_5_is_greedy(temperature: float) -> None:
    p = SamplingParams(temperature=temperature, top_k=5, top_p=0.5, seed=3)
    assert p.greedy
    logits = torch.from_numpy(np.random.default_rng(2).normal(0, 1, (16, V)).astype(np.float32))
    got = sample(logits, [p] * 16, [torch.Generator().manual_seed(3)] * 16).token_ids
    assert got == logits.argmax(-1).tolist()
    assert not SamplingParams(temperature=1e-5).greedy  # the boundary samples (and does not overflow)
    out = sample(logits, [SamplingParams(temperature=1e-5)] * 16, [torch.Generator().manual_seed(0)] * 16)
    assert out.token_ids == logits.argmax(-1).tolist()  # at 1e-5 the distribution is a point mass here


def _steps(batches: list[tuple[list[SamplingParams], int]], steps: int, seed_rows: dict) -> list[list[int]]:
    """Run ``steps`` sampling steps for each batch composition; return the tokens of the
    row whose params are ``seed_rows['target']`` in each composition."""
    out = []
    rng = np.random.default_rng(5)
    step_logits = [rng.normal(0, 1.5, V).astype(np.float32) for _ in range(steps)]
    for params, pos in batches:
        gens = [torch.Generator().manual_seed(p.seed) if p.seed is not None else seed_rows["engine"] for p in params]
        toks = []
        for t in range(steps):
            noise = torch.from_numpy(rng.normal(0, 1.5, (len(params), V)).astype(np.float32))
            noise[pos] = torch.from_numpy(step_logits[t])  # the target row sees the same logits each time
            toks.append(sample(noise, params, gens).token_ids[pos])
        out.append(toks)
    return out


def test_seeded_row_gives_the_same_tokens_whatever_its_batch_mates() -> None:
    target = SamplingParams(temperature=1.0, top_k=40, seed=42)
    engine = torch.Generator().manual_seed(0)
    mates = [
        SamplingParams(temperature=0.8),  # unseeded: the shared batched draw
        SamplingParams(temperature=0.0),  # greedy
        SamplingParams(temperature=1.2, seed=7, top_p=0.7),  # another seeded row; top_p: the sort path
        SamplingParams(temperature=0.9, min_p=0.1),
    ]
    batches = [
        ([target], 0),
        ([mates[0], target], 1),
        ([mates[1], mates[2], target, mates[3]], 2),
        ([*mates, target], 4),
        ([target, *mates[::-1]], 0),
    ]
    runs = _steps(batches, 12, {"target": target, "engine": engine})
    assert all(r == runs[0] for r in runs), runs
    assert len(set(runs[0])) > 3  # it does sample (not a point mass)
    other = _steps([([SamplingParams(temperature=1.0, top_k=40, seed=43)], 0)], 12, {"engine": engine})
    assert other[0] != runs[0]  # and the seed matters


def test_logprobs_are_those_of_the_raw_distribution() -> None:
    logits = torch.from_numpy(np.random.default_rng(3).normal(0, 1, (3, V)).astype(np.float32))
    params = [
        SamplingParams(temperature=0.3, top_k=3, logprobs=4, logit_bias={7: 30.0}),
        SamplingParams(temperature=0.0, logprobs=0, presence_penalty=2.0),
        SamplingParams(min_p=0.2),
    ]
    states = [PenaltyState.for_request(p, [1, 2], [5, 5], V) for p in params]
    out = sample(logits, params, [torch.Generator().manual_seed(0)] * 3, penalties=states)
    raw = torch.log_softmax(logits, -1)
    assert out.token_ids[0] == 7  # the bias decides the token, not the logprob
    assert out.logprobs == pytest.approx([raw[i, t].item() for i, t in enumerate(out.token_ids)])
    vals, ids = torch.topk(raw[0], 4)
    assert out.top_logprobs[0] == list(zip(ids.tolist(), vals.tolist(), strict=True))
    assert out.top_logprobs[1] == [] and out.top_logprobs[2] == []


# -- property-based ---------------------------------------------------------------------------------
valid_params = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.one_of(st.just(0.0), st.floats(0, 1e-4), st.floats(1e-5, 20.0), st.floats(1e-5, 1e308)),
        "top_k": st.one_of(st.none(), st.sampled_from([-1, 0]), st.integers(1, 3 * V)),
        "top_p": st.floats(1e-9, 1.0, exclude_min=True),
        "min_p": st.floats(0.0, 1.0),
        "repetition_penalty": st.one_of(st.floats(1e-3, 10.0), st.floats(1e-300, 1e300)),
        "presence_penalty": st.floats(-2.0, 2.0),
        "frequency_penalty": st.floats(-2.0, 2.0),
        "logit_bias": st.dictionaries(st.integers(0, V - 1), st.floats(-100, 100), max_size=5),
        "seed": st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    },
)


@settings(max_examples=150, deadline=None)
@given(kw=valid_params, row_seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([0.0, 0.01, 1.0, 30.0, 1e4]),
       output=st.lists(st.integers(0, V - 1), max_size=6))
# Found by hypothesis: a penalised logit divided by a tiny temperature overflowed to +inf (NaN softmax).
@example(kw={"temperature": 1e-05, "repetition_penalty": 1e-300}, row_seed=0, scale=10000.0, output=[2])
def test_any_valid_params_sample_a_token_the_distribution_allows(kw, row_seed, scale, output) -> None:
    p = SamplingParams(**kw)
    logits = torch.from_numpy(np.random.default_rng(row_seed).normal(0, scale, (2, V)).astype(np.float32))
    state = PenaltyState.for_request(p, [0, 1], list(output), V)
    gen = torch.Generator().manual_seed(p.seed if p.seed is not None else 0)
    out = sample(logits, [p, SamplingParams()], [gen, gen], [[3], []], [state, None])
    tok = out.token_ids[0]
    assert 0 <= tok < V and tok != 3  # banned ids never come out
    adjusted = adjust_logits(logits, [[3], []], [state, None])
    if p.greedy:
        assert tok == int(adjusted[0].argmax())
    else:
        assert processed_probs(adjusted[:1], [p])[0, tok] > 0
    assert math.isfinite(out.logprobs[0])


INVALID = {
    "temperature": [-0.1, -1e-9, math.nan, math.inf, "0.5", True, 10**400],
    "top_p": [0.0, -0.5, 1.0001, math.nan, None],
    "top_k": [-2, -100, 1.5, 2.0, "3", True],
    "min_p": [-0.01, 1.01, math.nan, math.inf],
    "repetition_penalty": [0.0, -1.0, math.nan, math.inf, 10**400],
    "presence_penalty": [2.01, -2.5, math.nan, math.inf],
    "frequency_penalty": [-2.01, 3.0, math.nan],
    "logit_bias": [{1: 100.5}, {1: -101.0}, {-1: 1.0}, {"1": 1.0}, {1.5: 1.0}, {1: math.nan}, [1, 2], {True: 1.0}],
}


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_invalid_values_raise_value_error_naming_the_field(data) -> None:
    name = data.draw(st.sampled_from(sorted(INVALID)))
    value = data.draw(st.sampled_from(INVALID[name]))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})


@pytest.mark.parametrize("top_k", [None, -1, 0])
def test_top_k_off_values(top_k) -> None:
    assert SamplingParams(top_k=top_k).top_k is None
    assert SamplingParams(top_k=np.int64(5)).top_k == 5
