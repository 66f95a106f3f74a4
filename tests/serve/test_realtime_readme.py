"""The realtime transcript in docs/realtime.md is true: its client messages, replayed against a fresh server
on the test model, produce exactly its server events (ids that are random by design masked).

To regenerate it: ``python tests/serve/test_realtime_readme.py MODEL_DIR`` prints the block
(``MODEL_DIR``: the test model, ``make_random("qwen3_moe", dir, seed=0)`` + ``write_tokenizer``)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest
from realtime_helpers import client
from serve_helpers import MODEL_NAME, engine_config, running_server

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.app import build_app

README = Path(__file__).resolve().parents[2] / "docs" / "realtime.md"  # the transcript's page
MARK = "<!-- realtime transcript: tests/serve/test_realtime_readme.py -->"
RANDOM_KEYS = {"id", "response_id", "branch_id", "state_key"}  # fresh random values every run

SCENARIO = [
    {"type": "session.create", "event_id": "c1",
     "session": {"id": "demo", "sampling": {"temperature": 0}, "max_tokens": 3}},
    {"type": "event.submit", "event_id": 1, "kind": "input", "data": {"text": "Hello"}},
    {"type": "response.create", "event_id": "r1"},
    {"type": "session.checkpoint", "event_id": "c2"},
    {"type": "response.create", "event_id": "r2", "input": {"token_ids": [40, 41]}, "max_tokens": 2},
    {"type": "session.rollback", "event_id": "c3", "checkpoint_id": "cp-1"},
    {"type": "response.create", "event_id": "r3", "input": {"token_ids": [40, 41]}, "max_tokens": 2},
    {"type": "event.submit", "event_id": 0, "kind": "input", "data": {"text": "late"}},
    {"type": "session.fork", "event_id": "c4", "session_id": "demo-b"},
    {"type": "response.create", "event_id": "c5", "max_tokens": 0},
    {"type": "session.close", "event_id": "c6"},
]


def mask(value):
    if isinstance(value, dict):
        return {k: "…" if k in RANDOM_KEYS else mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


async def capture(url: str) -> list[str]:
    """Run ``SCENARIO``, reading up to each answer (a response: until its done); the lines."""
    async with client(url) as c:
        for msg in SCENARIO:
            await c.send(msg)
            event = await c.recv()
            if event["type"] == "response.created":
                await c.until_done()
        return [f"{d} {json.dumps(m, ensure_ascii=False)}" for d, m in c.log]


def readme_lines() -> list[str]:
    text = README.read_text()
    block = re.search(re.escape(MARK) + r"\n```text\n(.*?)\n```", text, flags=re.S)
    assert block, f"docs/realtime.md lacks the transcript block after {MARK!r}"
    return block.group(1).split("\n")


@pytest.fixture(scope="module")
def fresh_url(model_dir):
    engine = AsyncEngine(LLMEngine(engine_config(model_dir)))
    try:
        with running_server(build_app(engine, MODEL_NAME)) as (url, _):
            yield url
    finally:
        engine.shutdown()


def test_readme_transcript_is_what_the_server_says(fresh_url):
    lines = readme_lines()
    sent = [json.loads(line[2:]) for line in lines if line.startswith("> ")]
    assert sent == SCENARIO
    got = asyncio.run(capture(fresh_url))
    assert len(got) == len(lines)
    for mine, theirs in zip(got, lines, strict=True):
        assert mine[:2] == theirs[:2]
        assert mask(json.loads(mine[2:])) == mask(json.loads(theirs[2:])), theirs


if __name__ == "__main__":
    engine = AsyncEngine(LLMEngine(engine_config(Path(sys.argv[1]))))
    try:
        with running_server(build_app(engine, MODEL_NAME)) as (url, _):
            print("\n".join(asyncio.run(capture(url))))
    finally:
        engine.shutdown()
