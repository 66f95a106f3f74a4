"""logit_bias and the repetition / presence / frequency penalties against values computed by hand.

Logits ``[2.0, -1.0, 0.5, -3.0, 1.0]``, prompt ``[0, 3]``, output so far ``[2, 2, 4]``:

- repetition 2 over prompt+output {0, 2, 3, 4}: 2/2, -1, 0.5/2, -3*2, 1/2 = [1, -1, 0.25, -6, 0.5]
- frequency 0.5, presence 0.3 over output (counts 2: 2, 4: 1):
  token 2 -= 0.5*2 + 0.3, token 4 -= 0.5 + 0.3 -> [2, -1, -0.8, -3, 0.2]
- logit_bias {1: 5} first: token 1 = 4 (not seen, so repetition leaves it) -> token 1 wins.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sampler_oracle import penalised

from execstate.engine.penalties import PenaltyState, apply_penalties
from execstate.engine.sampler import adjust_logits, sample
from execstate.engine.sampling_params import SamplingParams

LOGITS = [2.0, -1.0, 0.5, -3.0, 1.0]
PROMPT = [0, 3]
OUTPUT = [2, 2, 4]


def processed(params: SamplingParams, output: list[int] = OUTPUT) -> list[float]:
    state = PenaltyState.for_request(params, PROMPT, list(output), len(LOGITS))
    x = torch.tensor([LOGITS])
    return apply_penalties(x, [state])[0].tolist()


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (dict(repetition_penalty=2.0), [1.0, -1.0, 0.25, -6.0, 0.5]),
        (dict(repetition_penalty=0.5), [4.0, -1.0, 1.0, -1.5, 2.0]),  # < 1 encourages repeats
        (dict(frequency_penalty=0.5), [2.0, -1.0, -0.5, -3.0, 0.5]),
        (dict(presence_penalty=0.3), [2.0, -1.0, 0.2, -3.0, 0.7]),
        (dict(frequency_penalty=0.5, presence_penalty=0.3), [2.0, -1.0, -0.8, -3.0, 0.2]),
        (dict(frequency_penalty=-1.0), [2.0, -1.0, 2.5, -3.0, 2.0]),
        (dict(logit_bias={1: 5.0, 0: -100.0}), [-98.0, 4.0, 0.5, -3.0, 1.0]),
        (
            dict(logit_bias={1: 5.0}, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.3),
            [1.0, 4.0, 0.25 - 1.3, -6.0, 0.5 - 0.8],
        ),
    ],
)
def test_penalties_match_hand_computed_values(params: dict, expected: list[float]) -> None:
    got = processed(SamplingParams(**params))
    assert got == pytest.approx(expected, abs=1e-6)
    p = SamplingParams(**params)  # and the float64 oracle agrees
    ref = penalised(LOGITS, PROMPT, OUTPUT, p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.logit_bias)
    assert got == pytest.approx(ref.tolist(), abs=1e-6)


def test_which_token_wins_under_greedy() -> None:
    x = torch.tensor([LOGITS] * 5)
    cases = [
        (SamplingParams(temperature=0), 0),
        (SamplingParams(temperature=0, repetition_penalty=2.0), 0),  # 1.0 still beats 0.5
        (SamplingParams(temperature=0, repetition_penalty=3.0, logit_bias={1: 2.0}), 1),  # 1.0 vs 2/3
        (SamplingParams(temperature=0, presence_penalty=2.0, logit_bias={0: -1.5}), 0),  # 0.5 vs 2: -1.5, 4: -1.0
        (SamplingParams(temperature=0, logit_bias={3: 100.0}), 3),
    ]
    states = [PenaltyState.for_request(p, PROMPT, list(OUTPUT), 5) for p, _ in cases]
    gens = [None] * len(cases)
    got = sample(x, [p for p, _ in cases], gens, penalties=states).token_ids
    assert got == [w for _, w in cases]


def test_penalties_leave_other_rows_and_the_input_alone() -> None:
    x = torch.tensor([LOGITS, LOGITS])
    before = x.clone()
    state = PenaltyState.for_request(SamplingParams(presence_penalty=1.0), PROMPT, list(OUTPUT), 5)
    out = adjust_logits(x, None, [None, state])
    assert torch.equal(x, before)  # the runner's logits are not modified
    assert out[0].tolist() == LOGITS
    assert out[1].tolist() == pytest.approx([2.0, -1.0, -0.5, -3.0, 0.0])


def test_no_penalty_means_no_state_and_no_copy() -> None:
    assert PenaltyState.for_request(SamplingParams(), PROMPT, [], 5) is None
    assert PenaltyState.for_request(SamplingParams(logit_bias={}), PROMPT, [], 5) is None
    x = torch.tensor([LOGITS])
    assert adjust_logits(x, None, [None]) is x
    assert adjust_logits(x, [[]], None) is x


def test_banned_ids_and_penalties_combine() -> None:
    state = PenaltyState.for_request(SamplingParams(logit_bias={4: 10.0}), PROMPT, [], 5)
    out = adjust_logits(torch.tensor([LOGITS, LOGITS]), [[4], [0, 1]], [state, None])
    assert out[0].tolist() == [2.0, -1.0, 0.5, -3.0, float("-inf")]  # a ban beats any bias
    assert out[1].tolist() == [float("-inf"), float("-inf"), 0.5, -3.0, 1.0]


def test_state_counts_incrementally() -> None:
    """sync() counts only tokens appended since its last call: O(1) per generated token."""
    outputs: list[int] = []
    params = SamplingParams(frequency_penalty=1.0, repetition_penalty=1.5)
    state = PenaltyState(params, [7, 7, 9], outputs, 16)
    rng = np.random.default_rng(0)
    for _ in range(50):
        outputs.append(int(rng.integers(0, 16)))
        state.sync()
        assert state.counts.tolist() == np.bincount(outputs, minlength=16).tolist()
        assert sorted(state.positions.tolist()) == sorted(set(outputs) | {7, 9})  # distinct, prompt too
    outputs[0] = 15  # not allowed by the contract; shows that old tokens are never re-read
    outputs.append(3)
    state.sync()
    assert state.counts[15] == outputs[1:].count(15)
    assert state.counts.sum() == len(outputs)


def test_only_presence_frequency_have_no_prompt_state() -> None:
    outputs: list[int] = []
    s = PenaltyState(SamplingParams(presence_penalty=0.5), PROMPT, outputs, 5)
    assert s.positions.tolist() == []  # the prompt matters only for the repetition penalty
    out = apply_penalties(torch.tensor([LOGITS]), [s])
    assert out[0].tolist() == LOGITS  # prompt tokens are not penalised by presence
    outputs += [4, 1, 4]
    assert apply_penalties(torch.tensor([LOGITS]), [s])[0].tolist() == [2.0, -1.5, 0.5, -3.0, 0.5]
    assert s.positions.tolist() == [1, 4]  # distinct output ids (new ones sorted per step)


def test_positions_grow_past_the_initial_capacity() -> None:
    outputs = list(range(300))
    s = PenaltyState(SamplingParams(repetition_penalty=2.0), [299, 5000], outputs, 6000)
    s.sync()
    assert sorted(s.positions.tolist()) == [*range(300), 5000]
    x = torch.ones(1, 6000)
    apply_penalties(x, [s])
    assert x[0, :300].tolist() == [0.5] * 300 and x[0, 5000] == 0.5 and x[0, 300] == 1.0


def test_vocab_mismatch_is_an_error() -> None:
    s = PenaltyState(SamplingParams(presence_penalty=0.5), PROMPT, [], 7)
    with pytest.raises(ValueError, match="vocab"):
        apply_penalties(torch.tensor([LOGITS]), [s])
