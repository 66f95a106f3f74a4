"""Structured outputs and forced tool calls on the real SmolLM2 models, through the ``openai`` client
(slow: the embedded models). Every output is validated with ``jsonschema``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import openai
import pytest

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.app import build_app

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
from serve_helpers import running_server  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string", "maxLength": 24}},
          "required": ["name", "age", "city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module", params=["smollm2-135m", "smollm2-moe"])
def client(request):
    from execstate.model import registry

    d = registry.prepare(request.param)
    engine = AsyncEngine(LLMEngine(EngineConfig(model=str(d), max_model_len=2048)))
    try:
        with running_server(build_app(engine, "m")) as (url, _):
            yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_json_schema_response_is_valid(client):
    msgs = [{"role": "user", "content": "Describe a person who lives in Paris as JSON with name, age and city."}]
    for stream in (False, True):
        kw = {"model": "m", "messages": msgs, "max_tokens": 80, "temperature": 0,
              "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON,
                                                                         "strict": True}}}
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                           if c.choices)
        else:
            r = client.chat.completions.create(**kw)
            assert r.choices[0].finish_reason == "stop"
            text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.slow
def test_required_tool_call_is_valid(client):
    msgs = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=80, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    calls = {}
    for c in client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER], tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=80, temperature=0, stream=True):
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            calls[tc.index] = tc
    assert [c.function.arguments for c in calls.values()] == [call.function.arguments]
