"""The Hermes tool-call parser: one parser for the OpenAI API and the agent (execstate/tool_calls/)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from execstate.engine.grammar.spec import StructuredOutputsParams
from execstate.engine.llm import LLM
from execstate.engine.sampling_params import SamplingParams
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer
from execstate.tool_calls.call import FunctionSpec, ToolCall
from execstate.tool_calls.parsers import tool_parser

WEATHER = FunctionSpec("get_weather", "Weather in a city", {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False})
ADD = FunctionSpec("add", None, {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                                        "maximum": 99}}, "required": ["a"],
                                       "additionalProperties": False})


def test_render_then_parse_round_trips():
    p = tool_parser("hermes")
    calls = [ToolCall("get_weather", {"city": "Paris", "unit": "c"}), ToolCall("add", {"a": 1})]
    text = "Sure. " + p.render_calls(calls) + " Done."
    content, parsed, errors = p.parse(text, ["get_weather", "add"])
    assert parsed == calls and errors == [] and content == "Sure. \n Done."


@given(st.integers(0, 80), st.integers(0, 80))
def test_invalid_calls_come_back_as_text_when_asked(i, j):
    text = 'a <tool_call>{"name": "nope", "arguments": {}}</tool_call> b <tool_call>{"na'
    i, j = sorted((min(i, len(text)), min(j, len(text))))
    s = tool_parser().stream(["add"], invalid_as_text=True)
    out, calls, errors = [], [], []
    for piece in (text[:i], text[i:j], text[j:]):
        o, c, e = s.feed(piece)
        out.append(o)
        calls += c
        errors += e
    rest, end_errors = s.end()
    assert "".join(out) + rest == text and calls == []
    assert errors + end_errors == ["unknown tool 'nope'; known: ['add']",
                                   "tool call not closed before the response ended"]


def test_unknown_function_spec_is_refused():
    with pytest.raises(ValueError, match="function.name"):
        FunctionSpec.from_openai({"type": "function", "function": {"description": "x"}})
    with pytest.raises(ValueError, match="type 'function'"):
        FunctionSpec.from_openai({"type": "code_interpreter"})
    with pytest.raises(ValueError, match="unknown tool call parser"):
        tool_parser("mistral")


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    d = make_random("llama", tmp_path_factory.mktemp("tools_llama"), seed=0)
    write_tokenizer(Path(d))
    return LLM(d, max_model_len=256, seed=0)


@pytest.mark.parametrize("parallel", [False, True])
def test_the_grammar_forces_valid_calls_from_a_random_model(llm, parallel, torch_single_thread):
    p = tool_parser()
    grammar = p.grammar([WEATHER, ADD], parallel)
    schemas = {f.name: f.parameters for f in (WEATHER, ADD)}
    for seed in range(4):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=120,
                                structured_outputs=StructuredOutputsParams(grammar=grammar))
        c = llm.generate(["call a tool"], params, use_tqdm=False)[0].outputs[0]
        content, calls, errors = p.parse(c.text, schemas)
        if parallel and c.finish_reason == "length":  # a random model may go on calling until max_tokens
            assert errors == ["tool call not closed before the response ended"]
        else:
            assert c.finish_reason == "stop" and errors == [], c.text
        assert content.strip() == "" and calls
        assert parallel or len(calls) == 1
        for call in calls:
            jsonschema.validate(call.arguments, schemas[call.tool])
        assert json.loads(c.text.split("\n")[1])["name"] == calls[0].tool
