"""The agent transcript in docs/agent-protocol.md is true: its client messages, replayed against a fresh server on
the test model, produce server events of the same shapes, segment by segment (the events between
two client messages, compared as a multiset: the agent's clock decides their interleaving).
Masked: times, the session id, the model's text and what follows from it (token counts, a reply's
end reason). The transcript itself was captured from the real smollm2-135m (its text is real).

To regenerate it: ``python tests/serve/test_agent_readme.py smollm2-135m`` (or a model directory)
prints the block."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from agent_helpers import agent_client, check_stream
from realtime_helpers import slow_steps, wait_released
from serve_helpers import MODEL_NAME, engine_config, running_server, write_tokenizer

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.model.random_models import make_random
from execstate.serve.app import build_app

README = Path(__file__).resolve().parents[2] / "docs" / "agent-protocol.md"  # the transcript's page
MARK = "<!-- agent transcript: tests/serve/test_agent_readme.py -->"
MASKED = {"t", "output_text", "delta", "output_tokens", "context_tokens", "kept_tokens", "model", "reason",
          "session_id"}
DELTA = "response.output_text.delta"


def _done_with(cause: str, n: int = 1):
    """Until the ``n``-th ``usage`` after a response.done of a response created with ``cause``."""
    def until(events: list[dict[str, Any]]) -> bool:
        ids = {e["response"]["id"] for e in events if e["type"] == "response.created"
               and e["response"]["cause"] == cause}
        return sum(e["type"] == "usage" and e["response_id"] in ids for e in events) >= n
    return until


def _answer(kind: str):
    return lambda events: any(e["type"] == kind for e in events)


def _first_delta(events: list[dict[str, Any]]) -> bool:
    return any(e["type"] == DELTA for e in events)


SCENARIO: list[tuple[dict[str, Any], Any]] = [
    ({"type": "session.create", "event_id": "c1", "session": {
        "instructions": "A helpful voice assistant talks with a user.",
        "turn": {"end_of_turn_silence_s": 0.5, "backchannel_max_words": 2},
        "max_response_tokens": 16,
        "delegation": {"rules": [{"pattern": r"(?P<expression>\d+ times \d+)", "tool": "calculator"},
                                 {"pattern": r"code of (?P<key>\w+)", "tool": "lookup", "ack": "One moment."}]}}},
     _answer("session.created")),
    ({"type": "input_text.append", "event_id": "i1", "text": "Hi! What is 17 times 23?"}, _done_with("result")),
    ({"type": "input_text.append", "event_id": "i2", "text": "Tell me about the history of Rome."}, _first_delta),
    ({"type": "input_text.append", "event_id": "i3", "text": "Wait, no, what is the code of zebra?"},
     _done_with("result")),
    ({"type": "conversation.item.truncate", "event_id": "t1", "item_id": "resp_5", "audio_end_ms": 1600},
     _answer("conversation.item.truncated")),
    ({"type": "response.cancel", "event_id": "x1"}, _answer("error")),
    ({"type": "input_text.append", "event_id": "x2"}, _answer("error")),
    ({"type": "session.close", "event_id": "c2"}, _answer("session.closed")),
]


def mask(value: Any, key: str | None = None) -> Any:
    if key in MASKED:
        return "…"
    if key == "id" and isinstance(value, str) and value.startswith("sess-"):
        return "…"
    if isinstance(value, dict):
        return {k: mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


async def capture(url: str) -> list[str]:
    """Run ``SCENARIO`` (each message, then the events up to its end condition); the lines."""
    async with agent_client(url) as c:
        for msg, until in SCENARIO:
            n = len(c.events)
            await c.send(msg)
            await c.wait_for(lambda _e, n=n, until=until: until(c.events[n:]), n)
        await c.close()
        return [f"{d} {json.dumps(m, ensure_ascii=False)}" for d, m in c.log]


def segments(lines: list[str]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(client message, the server events after it) for each ``>`` line."""
    out: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for line in lines:
        event = json.loads(line[2:])
        if line.startswith("> "):
            out.append((event, []))
        else:
            assert line.startswith("< ") and out, line
            out[-1][1].append(event)
    return out


def shapes(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(mask(e), sort_keys=True) for e in events if e["type"] != DELTA)


def readme_lines() -> list[str]:
    block = re.search(re.escape(MARK) + r"\n```text\n(.*?)\n```", README.read_text(), flags=re.S)
    assert block, f"docs/agent-protocol.md lacks the transcript block after {MARK!r}"
    return block.group(1).split("\n")


def test_readme_agent_transcript_is_what_the_server_says(tmp_path):
    theirs = segments(readme_lines())
    assert [m for m, _ in theirs] == [m for m, _ in SCENARIO]
    # the test model, with room for the whole conversation (its text never stops: every reply is full)
    model_dir = make_random("qwen3_moe", tmp_path, seed=0, max_position_embeddings=1024)
    write_tokenizer(model_dir)
    engine = AsyncEngine(LLMEngine(engine_config(model_dir)))
    try:
        app = build_app(engine, MODEL_NAME)
        with running_server(app) as (url, _), slow_steps(engine, 0.02):
            mine = segments(asyncio.run(asyncio.wait_for(capture(url), 240)))
        wait_released(app.state.ctx.sessions)
    finally:
        engine.shutdown()
    assert len(mine) == len(theirs)
    for (msg, got), (_, want) in zip(mine, theirs, strict=True):
        assert shapes(got) == shapes(want), msg
        assert {tuple(sorted(e)) for e in got if e["type"] == DELTA} <= {tuple(sorted(e)) for e in want
                                                                        if e["type"] == DELTA} or not got
    for events in ([e for _, evs in theirs for e in evs], [e for _, evs in mine for e in evs]):
        check_stream(events)
    spoken = {e["response"]["id"]: e["response"]["output_text"] for _, evs in theirs for e in evs
              if e["type"] == "response.done"}
    assert " The answer is 391." in spoken["resp_2"] and " The answer is ZX-4417." in spoken["resp_5"]


if __name__ == "__main__":
    arg = sys.argv[1]
    if Path(arg).is_dir():
        cfg = engine_config(Path(arg))
    else:
        from execstate.model import registry

        cfg = EngineConfig(model=str(registry.prepare(arg)), seed=0)
    engine = AsyncEngine(LLMEngine(cfg))
    try:
        with running_server(build_app(engine, arg)) as (url, _):
            print("\n".join(asyncio.run(capture(url))))
    finally:
        engine.shutdown()
