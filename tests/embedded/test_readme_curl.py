"""The README's curl example: its request sets a temperature, and it gets the answer the README quotes.

At the OpenAI default temperature of 1 the embedded 135M-parameter model samples words far from an
answer; the README's request asks for greedy decoding. Fast: the request's body (parsed from the
README). Slow: the body sent to a server of the real ``smollm2-moe``, as the README's ``execstate
serve`` line starts it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _curl() -> tuple[str, dict]:
    """The README's chat curl command: its path and JSON body."""
    text = README.read_text()
    m = re.search(r"curl localhost:8000(/v1/chat/completions) .*? -d '(.*?)'\n", text, re.DOTALL)
    assert m is not None, "the README has no chat curl example"
    return m.group(1), json.loads(m.group(2))


def test_the_readme_curl_asks_for_greedy_decoding() -> None:
    path, body = _curl()
    assert path == "/v1/chat/completions" and body["model"] == "smollm2-moe"
    assert body.get("temperature") == 0


@pytest.mark.slow
def test_the_readme_curl_answers_what_the_readme_says(moe_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from execstate.engine.async_engine import AsyncEngine
    from execstate.engine.config import EngineConfig
    from execstate.engine.llm_engine import LLMEngine
    from execstate.serve.app import build_app

    path, body = _curl()
    engine = AsyncEngine(LLMEngine(EngineConfig(model="smollm2-moe", enable_return_routed_experts=True)))
    try:
        r = TestClient(build_app(engine, "smollm2-moe")).post(path, json=body)
        assert r.status_code == 200, r.text
        answer = r.json()["choices"][0]["message"]["content"]
        assert answer == "The capital of France is Paris, France."
        assert f'answers "{answer}"' in README.read_text().replace("\n", " ")
    finally:
        engine.shutdown()
