"""Deciding to delegate: a configured policy on the user's turn, or a tool call in the front's output.

Two paths (use either or both):

- **Policy** (:class:`RegexPolicy`): rules matched against the text of a finished user turn; the
  first match gives the tool and its arguments (the regex's named groups, or ``arguments(match)``).
  Deterministic, so it is what makes delegation reliable with a small front model. Patterns are
  RE2 (``google-re2``; case-insensitive): matching takes time linear in the text whatever the
  pattern, so a client's rule cannot stall the event loop it runs on (Python's ``re`` backtracks:
  ``(a+)+$`` on 25 ``a`` and a ``!`` takes seconds, and doubles with each ``a``). RE2 has no
  backreferences or lookaround; a pattern it cannot compile is a ``ValueError`` naming why
  (:func:`compile_pattern`).
- **Model** (:class:`ToolCallParser`): the front's output is scanned as it streams for
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the Hermes/Qwen/SmolLM2 format).
  Text outside calls is speech; text inside is held back, never emitted. A complete call is
  validated (JSON object, ``name`` a registered tool, ``arguments`` an object); an invalid one is
  reported as an error and dropped. A call still open when the response ends is invalid.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import re2

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
MAX_CALL_CHARS = 4096
MAX_PATTERN_MEMORY = 1 << 20  # bytes RE2 may use for one compiled pattern (its default is 8 MiB)


class Match(Protocol):
    """What a rule's ``arguments`` gets: a match (``re2``'s; the ``re.Match`` methods used here)."""

    def group(self, *groups: int | str) -> Any: ...

    def groupdict(self) -> dict[str, str | None]: ...


def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2, case-insensitive; ``ValueError`` saying why it cannot be."""
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False  # RE2 would print the parse error to stderr
    options.max_mem = MAX_PATTERN_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        why = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"not a valid regex (RE2 syntax: no backreferences or lookaround): {why}") from None


@dataclass(frozen=True)
class ToolCall:
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Rule:
    pattern: str
    tool: str
    arguments: Callable[[Match], dict[str, Any]] | None = None
    ack: str | None = None  # what the front says while the task runs (None: the policy's default)


class RegexPolicy:
    def __init__(self, rules: Iterable[Rule], ack: str = "Let me check.") -> None:
        """``ValueError`` when a rule's pattern is not one RE2 compiles (:func:`compile_pattern`)."""
        self.rules = [(compile_pattern(r.pattern), r) for r in rules]
        self.ack = ack

    def decide(self, text: str) -> tuple[ToolCall, str] | None:
        """(the call, the acknowledgement to speak) for the first matching rule, else None."""
        for rx, rule in self.rules:
            m = rx.search(text)
            if m is not None:
                args = rule.arguments(m) if rule.arguments is not None else m.groupdict()
                return ToolCall(rule.tool, dict(args)), rule.ack if rule.ack is not None else self.ack
        return None


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


class ToolCallParser:
    """Streaming split of the front's output into speech and tool calls (module docstring)."""

    def __init__(self, tools: Iterable[str]) -> None:
        self.tools = tuple(tools)
        self._buf = ""
        self._in_call = False

    def feed(self, text: str) -> tuple[str, list[ToolCall], list[str]]:
        """(speech to emit now, calls completed, errors) after ``text``."""
        self._buf += text
        speech, calls, errors = [], [], []
        while True:
            if not self._in_call:
                i = self._buf.find(OPEN_TAG)
                if i < 0:
                    keep = _partial_suffix(self._buf, OPEN_TAG)
                    speech.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                speech.append(self._buf[:i])
                self._buf = self._buf[i + len(OPEN_TAG):]
                self._in_call = True
            j = self._buf.find(CLOSE_TAG)
            if j < 0:
                if len(self._buf) > MAX_CALL_CHARS:
                    errors.append(f"tool call longer than {MAX_CALL_CHARS} characters")
                    self._buf, self._in_call = "", False
                break
            body, self._buf, self._in_call = self._buf[:j], self._buf[j + len(CLOSE_TAG):], False
            try:
                calls.append(validate_call(body.strip(), self.tools))
            except ValueError as exc:
                errors.append(str(exc))
        return "".join(speech), calls, errors

    def end(self) -> tuple[str, list[str]]:
        """At the end of a response: (held-back speech, errors); the parser is reset."""
        buf, in_call = self._buf, self._in_call
        self._buf, self._in_call = "", False
        if in_call:
            return "", ["tool call not closed before the response ended"]
        return buf, []


def _partial_suffix(s: str, tag: str) -> int:
    """Length of the longest suffix of ``s`` that is a proper prefix of ``tag``."""
    for n in range(min(len(s), len(tag) - 1), 0, -1):
        if s.endswith(tag[:n]):
            return n
    return 0
