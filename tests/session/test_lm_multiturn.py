"""Multi-turn without re-prefill: step k+1 runs only its new tokens plus the last
generated token of step k, and its tokens and routes equal a one-shot generate over the same
history (greedy) in a cold engine; ``s.routed_experts`` equals that generate's rows."""

from __future__ import annotations

import numpy as np
import pytest
from session_helpers import GREEDY, check_accounting, check_released, generate, make_llm, tokens

from execstate import SamplingParams


def test_multi_turn_equals_one_shot_generate_and_runs_only_new_tokens(moe_dir):
    llm, cold = make_llm(moe_dir), make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    history: list[int] = []
    for k, new in enumerate([tokens(1, 37), tokens(2, 5), tokens(3, 16), tokens(4, 1), tokens(5, 40)]):
        r = s.step(new, max_tokens=8)
        ref = generate(cold, history + new)  # a cold engine: every token computed
        assert r.step_index == k + 1 and r.finish_reason == "length"
        assert r.token_ids == ref.token_ids
        if history:
            assert (r.num_computed_tokens, r.num_cached_tokens) == (len(new) + 1, len(history) - 1)
        else:
            assert (r.num_computed_tokens, r.num_cached_tokens) == (len(new), 0)
        start = max(len(history) - 1, 0)
        assert r.routed_experts.tobytes() == ref.routed_experts[start:].tobytes()  # this step's rows
        history += new + r.token_ids
        assert s.token_ids == history
        rows = s.routed_experts
        assert rows.dtype == np.int16 and rows.shape == (len(history) - 1, 2, 2)
        assert rows.tobytes() == ref.routed_experts.tobytes()
        assert r.events == {"started": [k], "active": [], "completed": [k]}  # the shorthand's input event
        check_accounting(llm)
    s.close()
    check_released(llm)


def test_a_step_without_input_continues_from_the_last_generated_token(moe_dir):
    llm, cold = make_llm(moe_dir), make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    first = s.step(tokens(6, 20), max_tokens=5)
    more = s.step(max_tokens=5)
    assert (more.num_computed_tokens, more.num_cached_tokens) == (1, 24)
    assert first.token_ids + more.token_ids == generate(cold, tokens(6, 20), max_tokens=10).token_ids
    assert more.events == {"started": [], "active": [], "completed": []}
    s.close()
    check_released(llm)


def test_text_input_is_tokenised_like_generate(moe_dir):
    llm, cold = make_llm(moe_dir), make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    r1 = s.step("hello there", max_tokens=6)
    ref1 = cold.generate("hello there", GREEDY, use_tqdm=False)[0].outputs[0]
    assert r1.token_ids == ref1.token_ids[:6] and r1.text == cold.get_tokenizer().decode(r1.token_ids)
    r2 = s.step(" and more", max_tokens=6)
    tok = llm.get_tokenizer()
    ids = tok.encode("hello there") + r1.token_ids + tok.encode(" and more", add_special_tokens=False)
    assert s.token_ids == ids + r2.token_ids
    assert r2.token_ids == generate(cold, ids, max_tokens=6).token_ids
    s.close()


def test_each_step_samples_with_the_session_params_and_max_tokens(moe_dir):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert len(s.step(tokens(7, 10)).token_ids) == 3  # the session's max_tokens
    assert len(s.step([5], max_tokens=7).token_ids) == 7
    s.close()
    check_released(llm)


def test_logprobs_when_the_session_asks_for_them(moe_dir):
    llm, cold = make_llm(moe_dir), make_llm(moe_dir)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
    s = llm.open_session(sampling_params=params)
    s.step(tokens(8, 12))
    r = s.step([9, 10])
    ref = cold.generate({"prompt_token_ids": s.token_ids[:-4]}, params, use_tqdm=False)[0].outputs[0]
    assert [list(e) for e in r.logprobs] == [list(e) for e in ref.logprobs]
    assert [e[t].logprob for e, t in zip(r.logprobs, r.token_ids, strict=True)] == pytest.approx(
        [e[t].logprob for e, t in zip(ref.logprobs, ref.token_ids, strict=True)], abs=1e-5
    )  # prefill chunking: float noise
    assert r.cumulative_logprob == pytest.approx(ref.cumulative_logprob, abs=1e-4)
    assert GREEDY.logprobs is None and llm.open_session(sampling_params=GREEDY).step([5]).logprobs is None
