"""Chat turns on a session : ``s.step(messages=[...])`` applies the
model's chat template one turn at a time, and after every turn the session's context is token for
token what ``LLM.chat`` over the whole conversation prompts with and generates (the replies
decoded into the history as assistant messages). Two templates: the test tokenizer's (no EOS in
the template; replies end by ``max_tokens``) and a ChatML-like one whose turns end with the EOS
token (replies end by sampling it: the reply's own EOS is not repeated)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from execstate import LLM, SamplingParams, SessionEventError
from execstate.session.lm.chat import turn_text

CHATML = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
TURNS = ["Hello", "what is the weather like", "and tomorrow?"]


def _conversation(llm: LLM, params: SamplingParams) -> None:
    s = llm.open_session(sampling_params=params)
    tok = llm.engine.tokenizer
    history: list[dict[str, str]] = []
    for text in TURNS:
        turn = [{"role": "user", "content": text}]
        r = s.step(messages=turn)
        history += turn
        one_shot = llm.chat(history, params, use_tqdm=False)[0]
        expected = list(one_shot.prompt_token_ids) + list(one_shot.outputs[0].token_ids)
        assert s.token_ids == expected, (text, tok.decode(s.token_ids, False), tok.decode(expected, False))
        assert list(r.token_ids) == list(one_shot.outputs[0].token_ids)
        history.append({"role": "assistant", "content": tok.decode(list(r.token_ids))})
    s.close()


def test_turns_match_a_one_shot_chat(moe_dir):
    llm = LLM(str(moe_dir), seed=0)
    q = llm.engine.tokenizer.token_to_id("q")  # "qq" is no merge: a reply of q's is its text's tokens
    _conversation(llm, SamplingParams(temperature=0.0, max_tokens=3, logit_bias={q: 100.0}))


def test_turns_after_an_eos_reply_match_a_one_shot_chat(moe_dir, tmp_path: Path):
    d = tmp_path / "chatml"
    shutil.copytree(moe_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": CHATML}))
    llm = LLM(str(d), seed=0)
    eos = llm.engine.tokenizer.token_to_id("</s>")
    q = llm.engine.tokenizer.token_to_id("q")
    s = llm.open_session(sampling_params=SamplingParams(temperature=0.0, max_tokens=4, logit_bias={eos: 100.0}))
    r = s.step(messages=[{"role": "user", "content": "Hello"}])
    assert list(r.token_ids) == [eos] and r.finish_reason == "stop"
    s.close()
    _conversation(llm, SamplingParams(temperature=0.0, max_tokens=4, logit_bias={eos: 100.0}))
    _conversation(llm, SamplingParams(temperature=0.0, max_tokens=2, logit_bias={q: 100.0}))  # cut replies


def test_bad_turns_are_refused(moe_dir):
    llm = LLM(str(moe_dir), seed=0)
    s = llm.open_session()
    for bad in ([], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 3}], "Hello",
                [{"role": "user", "content": "x", "extra": 1}]):
        with pytest.raises(SessionEventError) as e:
            s.step(messages=bad)
        assert e.value.code == "invalid" and "messages" in e.value.message
    with pytest.raises(SessionEventError, match="not both"):
        s.step("text", messages=[{"role": "user", "content": "x"}])
    assert s.token_ids == []


def test_a_template_that_looks_ahead_is_refused(moe_dir):
    tok = LLM(str(moe_dir), seed=0).engine.tokenizer
    tok._template = tok._template.environment.from_string(  # renders the last message differently
        "{% for m in messages %}{{ m['content'] }}{% if loop.last %}!{% endif %}{% endfor %}")
    with pytest.raises(ValueError, match="one turn at a time"):
        turn_text(tok, [{"role": "user", "content": "x"}], first=False, after_eos=False)
