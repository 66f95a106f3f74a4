"""The Hermes / Qwen / SmolLM2 tool-call format:
``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one block per call.

The stream scans the output for ``<tool_call>``; text outside blocks is content, text inside is
held back until ``</tool_call>`` and then validated as a JSON object with a string ``name`` (a
known tool) and an object ``arguments`` (missing: ``{}``). A block longer than ``max_call_chars``
is an error (bounded memory whatever the model writes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from execstate.tool_calls.call import FunctionSpec, ToolCall
from execstate.tool_calls.parser import ToolCallStream, ToolParser

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
MAX_CALL_CHARS = 4096
# Forced calls: JSON as the model writes it in the examples it was trained on, and no free
# whitespace a small model could loop on.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def validate_call(body: str, tools: Iterable[str]) -> ToolCall:
    """The call in ``body`` (the text between the tags); ValueError saying what is wrong."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool call is not JSON: {exc.msg}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("tool call must be an object with a string 'name'")
    known = set(tools)
    if obj["name"] not in known:
        raise ValueError(f"unknown tool {obj['name']!r}; known: {sorted(known)}")
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        raise ValueError("tool call 'arguments' must be an object")
    return ToolCall(obj["name"], args)


class HermesStream(ToolCallStream):
    def __init__(self, tools: Iterable[str], invalid_as_text: bool = False,
                 max_call_chars: int = MAX_CALL_CHARS) -> None:
        self.tools = tuple(tools)
        self.invalid_as_text = invalid_as_text
        self.max_call_chars = max_call_chars
        self._buf = ""
        self._in_call = False

    def feed(self, text: str) -> tuple[str, list[ToolCall], list[str]]:
        self._buf += text
        out: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        while True:
            if not self._in_call:
                i = self._buf.find(OPEN_TAG)
                if i < 0:
                    keep = _partial_suffix(self._buf, OPEN_TAG)
                    out.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                out.append(self._buf[:i])
                self._buf = self._buf[i + len(OPEN_TAG):]
                self._in_call = True
            j = self._buf.find(CLOSE_TAG)
            if j < 0:
                if len(self._buf) > self.max_call_chars:
                    errors.append(f"tool call longer than {self.max_call_chars} characters")
                    if self.invalid_as_text:
                        out.append(OPEN_TAG + self._buf)
                    self._buf, self._in_call = "", False
                break
            body, self._buf, self._in_call = self._buf[:j], self._buf[j + len(CLOSE_TAG):], False
            try:
                calls.append(validate_call(body.strip(), self.tools))
            except ValueError as exc:
                errors.append(str(exc))
                if self.invalid_as_text:
                    out.append(OPEN_TAG + body + CLOSE_TAG)
        return "".join(out), calls, errors

    def end(self) -> tuple[str, list[str]]:
        buf, in_call = self._buf, self._in_call
        self._buf, self._in_call = "", False
        if in_call:
            return (OPEN_TAG + buf if self.invalid_as_text else ""), ["tool call not closed before the response ended"]
        return buf, []


class HermesToolParser(ToolParser):
    name = "hermes"

    def __init__(self, max_call_chars: int = MAX_CALL_CHARS) -> None:
        self.max_call_chars = max_call_chars

    def stream(self, tools: Iterable[str], invalid_as_text: bool = False) -> HermesStream:
        return HermesStream(tools, invalid_as_text, self.max_call_chars)

    def grammar(self, functions: list[FunctionSpec], parallel: bool) -> str:
        if not functions:
            raise ValueError("a forced tool call needs at least one function")
        bodies = []
        for i, f in enumerate(functions):
            schema: dict[str, Any] = {
                "type": "object", "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": _JSON_STYLE,
            }
            bodies.append(f"fn_{i}: %json {json.dumps(schema)}")
        start = "start: call (\"\\n\" call)*" if parallel else "start: call"
        alts = " | ".join(f"fn_{i}" for i in range(len(functions)))
        return "\n".join([start, f'call: "{OPEN_TAG}\\n" ({alts}) "\\n{CLOSE_TAG}"', *bodies])

    def system_prompt(self, functions: list[FunctionSpec]) -> str:
        sigs = "\n".join(json.dumps(f.to_openai(), ensure_ascii=False) for f in functions)
        return ("You are a function calling AI model. You may call one or more functions to assist with the user "
                "query. Here are the available tools:\n<tools>\n" + sigs + "\n</tools>\n"
                "For each function call, return a JSON object with the function name and arguments within "
                f"{OPEN_TAG}{CLOSE_TAG} tags:\n{OPEN_TAG}\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n' + CLOSE_TAG)

    def render_calls(self, calls: list[ToolCall]) -> str:
        return "\n".join(f'{OPEN_TAG}\n{json.dumps({"name": c.tool, "arguments": c.arguments}, ensure_ascii=False)}'
                         f"\n{CLOSE_TAG}" for c in calls)

    def render_result(self, text: str) -> str:
        return f"<tool_response>\n{text}\n</tool_response>"


def _partial_suffix(s: str, tag: str) -> int:
    """Length of the longest suffix of ``s`` that is a proper prefix of ``tag``."""
    for n in range(min(len(s), len(tag) - 1), 0, -1):
        if s.endswith(tag[:n]):
            return n
    return 0
