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
- **Model**: the front's output is scanned as it streams by a tool-call parser
  (``execstate/tool_calls/``, the one the OpenAI API uses too; ``AgentConfig.tool_call_parser``,
  the Hermes/Qwen/SmolLM2 ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` format by
  default). Text outside calls is speech; text inside is held back, never emitted. A complete call
  is validated (JSON object, ``name`` a registered tool, ``arguments`` an object); an invalid one is
  reported as an error and dropped. A call still open when the response ends is invalid.

``ToolCall`` lives in ``execstate/tool_calls/call.py``; the stream parser of calls in
``execstate/tool_calls/hermes.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import re2

from execstate.tool_calls.call import ToolCall

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
