"""``execstate serve --chat-template`` (vLLM's option): a template file or the template's text, used for
every chat prompt in place of the model's own.

Oracle: the custom template rendered by hand (its format is fixed here) and encoded by the model's
tokenizer; the prompt token ids the server reports, ``/tokenize`` and a session's chat turn must be
exactly those, and differ from what the model's own template gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from serve_helpers import MODEL_NAME, engine_config

from execstate import cli
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.chat_template import load_chat_template
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.tokenizer import Tokenizer
from execstate.serve.app import build_app
from execstate.serve.server import engine_config_from_args

CUSTOM = ("{% for m in messages %}<<{{ m.role }}>> {{ m.content }}\n{% endfor %}"
          "{% if add_generation_prompt %}<<assistant>> {% endif %}")
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name three colors"}]
RENDERED = "<<system>> be brief\n<<user>> name three colors\n<<assistant>> "


@pytest.fixture(scope="module")
def templated(model_dir):
    engine = AsyncEngine(LLMEngine(engine_config(model_dir, chat_template=CUSTOM)))
    yield engine, TestClient(build_app(engine, MODEL_NAME))
    engine.shutdown()


def test_chat_completions_render_the_custom_template(templated, model_dir) -> None:
    engine, client = templated
    want = Tokenizer(model_dir).encode(RENDERED, add_special_tokens=False)
    own = Tokenizer(model_dir).apply_chat_template(MESSAGES)
    assert own != RENDERED  # the model's own template renders something else
    r = client.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 2,
                                                  "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == want
    tok = client.post("/tokenize", json={"model": MODEL_NAME, "messages": MESSAGES}).json()
    assert tok["tokens"] == want


def test_a_sessions_chat_turn_renders_the_custom_template(templated, model_dir) -> None:
    _, client = templated
    tok = Tokenizer(model_dir)
    sid = client.post("/v1/sessions", json={"sampling": {"temperature": 0}}).json()["session_id"]
    first = client.post(f"/v1/sessions/{sid}/step", json={"messages": MESSAGES[1:], "max_tokens": 3})
    assert first.status_code == 200, first.text
    context = client.get(f"/v1/sessions/{sid}").json()["token_ids"]
    opening = tok.encode("<<user>> name three colors\n<<assistant>> ", add_special_tokens=False)
    assert context[:len(opening)] == opening
    second = client.post(f"/v1/sessions/{sid}/step", json={"messages": [{"role": "user", "content": "more"}],
                                                            "max_tokens": 2})
    assert second.status_code == 200, second.text
    after = client.get(f"/v1/sessions/{sid}").json()["token_ids"]
    turn = tok.encode("\n<<user>> more\n<<assistant>> ", add_special_tokens=False)  # the closing, then the turn
    assert after[len(context):len(context) + len(turn)] == turn
    client.delete(f"/v1/sessions/{sid}")


def test_load_chat_template_takes_a_file_or_the_text(tmp_path: Path) -> None:
    f = tmp_path / "template.jinja"
    f.write_text(CUSTOM)
    assert load_chat_template(str(f)) == CUSTOM == load_chat_template(f)
    assert load_chat_template(CUSTOM) == CUSTOM
    typed = CUSTOM.replace("\n", "\\n")  # as typed on a command line: a backslash and an n
    assert load_chat_template(typed) == CUSTOM
    assert load_chat_template("{{ 'é' }}\\n{{ '中' }}") == "{{ 'é' }}\n{{ '中' }}"
    with pytest.raises(ValueError, match="looks like a file path, but it cannot be read"):
        load_chat_template(str(tmp_path / "tmeplate.jinja"))  # a typo is not a one-line template
    with pytest.raises(ValueError, match="does not compile"):
        load_chat_template("{% for m in messages %}")
    (tmp_path / "empty.jinja").write_text(" \n")
    with pytest.raises(ValueError, match="is empty"):
        load_chat_template(str(tmp_path / "empty.jinja"))


def test_the_serve_option(tmp_path: Path, model_dir, capsys) -> None:
    f = tmp_path / "template.jinja"
    f.write_text(CUSTOM)
    parser = cli.build_parser()
    args = parser.parse_args(["serve", str(model_dir), "--chat-template", str(f)])
    assert args.chat_template == CUSTOM and engine_config_from_args(args).chat_template == CUSTOM
    assert parser.parse_args(["serve", str(model_dir)]).chat_template is None
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["serve", str(model_dir), "--chat-template", str(tmp_path / "missing.jinja")])
    assert exit_.value.code == 2
    assert "argument --chat-template: the chat template" in capsys.readouterr().err


def test_an_engine_refuses_a_template_that_does_not_compile_or_has_no_tokenizer(model_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="--chat-template: the chat template does not compile"):
        Tokenizer(model_dir, "{% if %}")
    from execstate.model.random_models import make_random

    bare = make_random("qwen3_moe", tmp_path / "bare", seed=0)  # no tokenizer.json
    with pytest.raises(ValueError, match="no tokenizer.json"):
        LLMEngine(EngineConfig(model=str(bare), chat_template=CUSTOM))
