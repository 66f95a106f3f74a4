"""Chat turns on the real SmolLM2-135M-Instruct (``s.step("Hello")`` returned nonsense
because sessions ignored the chat template). ``s.step(messages=...)`` renders each turn with the
model's ChatML template; every turn's context and reply equal ``LLM.chat`` over the whole
conversation, token for token, replies ending with ``<|im_end|>`` (the EOS) included."""

from __future__ import annotations

import pytest

from execstate import LLM, SamplingParams


@pytest.mark.slow
def test_smollm2_chat_turns_equal_one_shot_chat():
    llm = LLM("smollm2-135m", seed=0)
    tok = llm.engine.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=40)
    s = llm.open_session(sampling_params=params)
    history: list[dict[str, str]] = []
    finishes = []
    for text in ("Hello", "What is the capital of France?"):
        turn = [{"role": "user", "content": text}]
        r = s.step(messages=turn)
        history += turn
        one_shot = llm.chat(history, params, use_tqdm=False)[0]
        assert s.token_ids == list(one_shot.prompt_token_ids) + list(one_shot.outputs[0].token_ids)
        finishes.append(r.finish_reason)
        history.append({"role": "assistant", "content": tok.decode(list(r.token_ids))})
    assert "stop" in finishes  # at least one reply ended with <|im_end|>: the closing after an EOS was exercised
    assert "Paris" in history[-1]["content"]
    s.close()
