"""The new sampling parameters through the engine, on a tiny random Llama.

Oracles: Hugging Face ``generate`` on the same weights (greedy) with its own
``RepetitionPenaltyLogitsProcessor`` and ``SequenceBiasLogitsProcessor``, and a
presence/frequency processor written here from OpenAI's formula; plus properties of the
output (a +100 bias forces its token, a strong presence penalty stops repeats).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from execstate import LLM, SamplingParams

PROMPT = list(range(10, 30))
N = 24


@pytest.fixture(scope="module")
def llm(dense_dir) -> LLM:
    return LLM(str(dense_dir), seed=0)


def run(llm: LLM, prompt: list[int] = PROMPT, **kw) -> list[int]:
    p = SamplingParams(max_tokens=N, ignore_eos=True, **kw)
    return llm.generate({"prompt_token_ids": prompt}, p, use_tqdm=False)[0].outputs[0].token_ids


class OpenAIPenalties:
    """``logits -= presence * (count > 0) + frequency * count`` over generated tokens (HF processor)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        for t, c in Counter(input_ids[0, self.prompt_len :].tolist()).items():
            scores[0, t] -= self.presence + self.frequency * c
        return scores


def hf_greedy(path, prompt: list[int], **gen_kw) -> list[int]:
    from transformers import AutoModelForCausalLM, LogitsProcessorList

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    procs = gen_kw.pop("processors", [])
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=N, min_new_tokens=N, do_sample=False,
            logits_processor=LogitsProcessorList(procs), **gen_kw,
        )
    return out[0, len(prompt) :].tolist()


def test_greedy_repeats_without_penalties(llm) -> None:
    """The baseline the penalty tests need: plain greedy repeats tokens on this model."""
    out = run(llm, temperature=0.0)
    assert len(set(out)) < len(out)


@pytest.mark.parametrize(
    ("ours", "hf"),
    [
        (dict(repetition_penalty=1.3), dict(repetition_penalty=1.3)),
        (dict(logit_bias={6: -100.0, 57: 3.0}), dict(sequence_bias={(6,): -100.0, (57,): 3.0})),
        (dict(presence_penalty=1.5), dict(processors=[OpenAIPenalties(len(PROMPT), 1.5, 0.0)])),
        (dict(frequency_penalty=0.7), dict(processors=[OpenAIPenalties(len(PROMPT), 0.0, 0.7)])),
        (
            dict(frequency_penalty=0.4, presence_penalty=0.5),
            dict(processors=[OpenAIPenalties(len(PROMPT), 0.5, 0.4)]),
        ),
    ],
    ids=["repetition", "logit_bias", "presence", "frequency", "presence+frequency"],
)
def test_greedy_with_penalties_matches_transformers(llm, dense_dir, ours: dict, hf: dict) -> None:
    got = run(llm, temperature=0.0, **ours)
    assert got == hf_greedy(dense_dir, PROMPT, **hf)
    assert got != run(llm, temperature=0.0)  # the parameter changed the output


def test_logit_bias_plus_100_forces_its_token(llm) -> None:
    assert run(llm, temperature=1.0, logit_bias={77: 100.0}) == [77] * N
    assert run(llm, temperature=1.0, seed=3, top_p=0.5, logit_bias={78: 100.0}) == [78] * N
    greedy = run(llm, temperature=0.0)
    banned = run(llm, temperature=0.0, logit_bias={greedy[0]: -100.0, greedy[3]: -100.0})
    assert greedy[0] not in banned and greedy[3] not in banned


@pytest.mark.parametrize("kw", [dict(presence_penalty=2.0), dict(frequency_penalty=2.0)])
def test_strong_output_penalty_stops_repeats(llm, kw) -> None:
    out = run(llm, temperature=0.0, **kw)
    assert len(set(out)) == len(out)
    sampled = run(llm, temperature=0.7, seed=11, **kw)
    assert len(set(sampled)) == len(sampled)


def test_strong_repetition_penalty_avoids_prompt_and_output_tokens(llm) -> None:
    out = run(llm, temperature=0.0, repetition_penalty=10.0)
    assert len(set(out)) == len(out) and not set(out) & set(PROMPT)


def test_min_p_1_is_greedy(llm) -> None:
    assert run(llm, temperature=1.0, min_p=1.0, seed=5) == run(llm, temperature=0.0)
    assert run(llm, temperature=1e-6) == run(llm, temperature=0.0)


def test_seeded_penalised_request_is_batch_invariant(llm) -> None:
    p = SamplingParams(temperature=0.9, seed=21, presence_penalty=1.0, repetition_penalty=1.2, max_tokens=N,
                       ignore_eos=True, logit_bias={5: 2.0})
    alone = llm.generate({"prompt_token_ids": PROMPT}, p, use_tqdm=False)[0].outputs[0].token_ids
    others = [
        SamplingParams(temperature=1.0, max_tokens=7, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, frequency_penalty=1.0),
        SamplingParams(temperature=0.5, seed=1, top_k=5, max_tokens=N, ignore_eos=True),
    ]
    prompts = [np.random.default_rng(i).integers(3, 500, 9 + i).tolist() for i in range(3)]
    outs = llm.generate(
        [{"prompt_token_ids": q} for q in [prompts[0], prompts[1], PROMPT, prompts[2]]],
        [others[0], others[1], p, others[2]], use_tqdm=False,
    )
    assert outs[2].outputs[0].token_ids == alone


def test_logit_bias_outside_the_vocabulary_is_rejected(llm) -> None:
    with pytest.raises(ValueError, match=r"logit_bias.*512"):
        run(llm, logit_bias={512: 1.0})
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_integrity()
