"""Tool calling on ``/v1/chat/completions``: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

- ``tool_request(req)``: the request's tools (400 naming the field for a bad declaration, an
  unknown named function, ``required`` without tools, more than ``MAX_TOOLS``), or None.
  ``tool_choice``: ``"auto"`` (default with tools: the model decides, its output is parsed),
  ``"none"`` (tools are left out of the prompt and nothing is parsed), ``"required"`` or
  ``{"type": "function", "function": {"name": ...}}`` (the grammar of the parser forces one call,
  or with ``parallel_tool_calls`` one or more, of the allowed functions with schema-valid
  arguments: ``ToolRequest.constraint``).
- ``prompt_messages(messages, tools, template)``: the messages and template arguments. A template
  that renders ``tools`` gets them; otherwise the parser's system prompt declares them. Past
  assistant ``tool_calls`` (arguments as JSON text) become dicts for a template that renders
  them, else the parser's text; ``tool`` messages are wrapped as the parser's format expects.
- ``ToolOutput``: one choice's output split into content and ``tool_calls`` (ids ``call_...``),
  whole or streamed. ``finish_reason`` becomes ``"tool_calls"`` when the choice made calls.

The parser (``execstate/tool_calls/``, Hermes ``<tool_call>`` JSON) is the one the agent uses.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from execstate.engine.grammar.spec import StructuredOutputsParams
from execstate.serve.errors import bad_request
from execstate.serve.openai.protocol import (
    ChatCompletionRequest,
    DeltaToolCall,
    FunctionCall,
    ToolCallOut,
)
from execstate.tool_calls.call import FunctionSpec, ToolCall
from execstate.tool_calls.parser import ToolCallStream, ToolParser
from execstate.tool_calls.parsers import tool_parser

MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolRequest:
    parser: ToolParser
    functions: list[FunctionSpec]
    choice: str  # "auto" | "none" | "required" | the name of the function it must call
    parallel: bool

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.functions]

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    @property
    def constraint(self) -> StructuredOutputsParams | None:
        if self.choice in ("auto", "none"):
            return None
        forced = self.functions if self.choice == "required" else [f for f in self.functions if f.name == self.choice]
        parallel = self.parallel and self.choice == "required"
        return StructuredOutputsParams(grammar=self.parser.grammar(forced, parallel))


def tool_request(req: ChatCompletionRequest, parser_name: str = "hermes") -> ToolRequest | None:
    choice = req.tool_choice
    named = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", '
                              '"function": {"name": ...}}', param="tool_choice")
        named = fn["name"]
    elif choice not in (None, "none", "auto", "required"):
        raise bad_request(f'tool_choice must be "none", "auto", "required" or a function, got {choice!r}',
                          param="tool_choice")
    if not req.tools:
        if named is not None or choice == "required":
            raise bad_request("tool_choice requires tools", param="tool_choice")
        return None
    if len(req.tools) > MAX_TOOLS:
        raise bad_request(f"tools has {len(req.tools)} entries; at most {MAX_TOOLS} allowed", param="tools")
    try:
        functions = [FunctionSpec.from_openai(t) for t in req.tools]
    except ValueError as exc:
        raise bad_request(f"tools: {exc}", param="tools") from None
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise bad_request("tools: function names must be unique", param="tools")
    if named is not None and named not in names:
        raise bad_request(f"tool_choice names {named!r}, which is not in tools", param="tool_choice")
    mode = named if named is not None else str(choice or "auto")  # a str here: a dict choice names one
    parallel = req.parallel_tool_calls is not False
    return ToolRequest(tool_parser(parser_name), functions, mode, parallel)


def prompt_messages(messages: list[dict[str, Any]], tools: ToolRequest | None, template: str | None,
                    parser_name: str = "hermes") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages to render and the template's extra arguments (module docstring)."""
    parser = tools.parser if tools is not None else tool_parser(parser_name)
    source = template or ""
    renders_calls = "tool_calls" in source
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        calls = m.get("tool_calls")
        if calls:
            parsed = _history_calls(i, calls)
            if renders_calls:
                m["tool_calls"] = [{"id": c.get("id"), "type": "function",
                                    "function": {"name": p.tool, "arguments": p.arguments}}
                                   for c, p in zip(calls, parsed, strict=True)]
            else:
                m.pop("tool_calls")
                m["content"] = "\n".join(x for x in (m.get("content") or "", parser.render_calls(parsed)) if x)
        elif m.get("role") == "tool" and not renders_calls:
            m["content"] = parser.render_result(m.get("content") or "")
        out.append(m)
    kwargs: dict[str, Any] = {}
    if tools is not None and tools.choice != "none":
        if "tools" in source:
            kwargs["tools"] = [f.to_openai() for f in tools.functions]
        else:
            declare = parser.system_prompt(tools.functions)
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{declare}".lstrip()}
            else:
                out.insert(0, {"role": "system", "content": declare})
    return out, kwargs


def _history_calls(i: int, calls: Any) -> list[ToolCall]:
    if not isinstance(calls, list):
        raise bad_request(f"messages[{i}].tool_calls must be a list", param="messages")
    parsed = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"messages[{i}].tool_calls: each needs function.name", param="messages")
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            raise bad_request(f"messages[{i}].tool_calls: arguments must be JSON", param="messages") from None
        if not isinstance(args, dict):
            raise bad_request(f"messages[{i}].tool_calls: arguments must be a JSON object", param="messages")
        parsed.append(ToolCall(fn["name"], args))
    return parsed


def _out(call: ToolCall) -> tuple[str, FunctionCall]:
    return f"call_{uuid.uuid4().hex[:24]}", FunctionCall(name=call.tool, arguments=json.dumps(call.arguments))


class ToolOutput:
    """One choice's output as content and tool calls (module docstring)."""

    def __init__(self, tools: ToolRequest) -> None:
        self.tools = tools
        self.num_calls = 0
        self._stream: ToolCallStream = tools.parser.stream(tools.names, invalid_as_text=True)

    def whole(self, text: str) -> tuple[str | None, list[ToolCallOut] | None]:
        """``(content, tool_calls)`` of a finished output: when any call is invalid, none is
        returned and the whole text is the content."""
        content, calls, errors = self.tools.parser.parse(text, self.tools.names)
        if errors or not calls:
            return text, None
        if not self.tools.parallel:
            calls = calls[:1]
        self.num_calls = len(calls)
        forced = self.tools.choice not in ("auto", "none")
        shown = None if forced or not content.strip() else content
        return shown, [ToolCallOut(id=i, function=f) for i, f in map(_out, calls)]

    def feed(self, text: str) -> tuple[str, list[DeltaToolCall]]:
        """A streamed delta: the content to send now and the calls completed by it."""
        content, calls, _ = self._stream.feed(text)
        deltas = []
        for call in calls:
            if self.tools.parallel or self.num_calls == 0:
                call_id, fn = _out(call)
                deltas.append(DeltaToolCall(index=self.num_calls, id=call_id, function=fn))
                self.num_calls += 1
        return content, deltas

    def end(self) -> str:
        """The content held back at the end of a stream."""
        return self._stream.end()[0]

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.num_calls and reason == "stop" else reason
