"""Tool calling over HTTP with the ``openai`` client: ``tool_choice`` required and named are forced by
the grammar (a random model calls validly), streamed and not; tool messages in the history."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from serve_helpers import MODEL_NAME, engine_config, running_server, write_tokenizer

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.model.random_models import make_random
from execstate.serve.app import build_app

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                                         "maximum": 999}},
                                  "required": ["a"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


class _Served:
    def __init__(self, engine: AsyncEngine, url: str) -> None:
        self.engine, self.url = engine, url


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A random dense model with room for the tools' declarations (2048 positions)."""
    d = make_random("llama", tmp_path_factory.mktemp("tools_http"), seed=0, max_position_embeddings=2048)
    write_tokenizer(d)
    engine = AsyncEngine(LLMEngine(engine_config(d, enable_return_routed_experts=False)))
    try:
        with running_server(build_app(engine, MODEL_NAME)) as (url, _):
            yield _Served(engine, url)
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("seed", [0, 1])
def test_required_returns_a_valid_call(client, seed):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=120)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    _valid(call.function.name, call.function.arguments)


def test_named_choice_calls_that_function(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, temperature=1.0, seed=5,
                                       tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=120)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add"
    _valid("add", call.function.arguments)


@pytest.mark.parametrize("seed", [3])
def test_required_streamed_returns_valid_calls(client, seed):
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                            temperature=1.0, seed=seed, max_tokens=200, stream=True)
    calls, content, finish = {}, "", None
    for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                assert tc.index not in calls and tc.id.startswith("call_")
                calls[tc.index] = tc
            finish = ch.finish_reason or finish
    assert calls and sorted(calls) == list(range(len(calls)))
    for tc in calls.values():
        _valid(tc.function.name, tc.function.arguments)
    assert finish in ("tool_calls", "length")
    assert content.strip() == "" or (
        finish == "length" and content.strip().startswith("<tool_call>")
    )  # cut off mid-call
    # the same request, not streamed, makes the same calls (same seed)
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       temperature=1.0, seed=seed, max_tokens=200)
    whole = r.choices[0].message.tool_calls or []
    if finish == "tool_calls":
        assert [(c.function.name, c.function.arguments) for c in whole] == \
            [(calls[i].function.name, calls[i].function.arguments) for i in sorted(calls)]


def test_a_conversation_with_tool_results(client, served):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
    ]
    r = client.chat.completions.create(model=MODEL_NAME, messages=history, tools=TOOLS, max_tokens=8,
                                       temperature=0, extra_body={"return_token_ids": True})
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the prompt carries the tools' declaration, the past call and the result as the parser writes them
    prompt = served.engine.tokenizer.decode((r.model_extra or {})["prompt_token_ids"], skip_special_tokens=False)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}' in prompt
    assert "<tool_response>\n21 C, sunny\n</tool_response>" in prompt
    with pytest.raises(openai.BadRequestError, match="arguments must be JSON"):
        bad = [history[0], {**history[1], "tool_calls": [{"id": "x", "type": "function",
                                                         "function": {"name": "add", "arguments": "{oops"}}]}]
        client.chat.completions.create(model=MODEL_NAME, messages=bad, max_tokens=4)


def test_tool_choice_none_leaves_tools_out(client, served):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                       max_tokens=4, extra_body={"return_token_ids": True})
    prompt = served.engine.tokenizer.decode((r.model_extra or {})["prompt_token_ids"], skip_special_tokens=False)
    assert "<tools>" not in prompt and r.choices[0].message.tool_calls is None
