"""The tool-call parser interface: one implementation per output format (model family).

Contracts:

- ``stream(tools)`` returns a fresh :class:`ToolCallStream` for one response. ``feed(text)``
  takes the next piece of output and returns ``(text to show now, calls completed, errors)``;
  text that may belong to a call is held back until it is known not to; ``end()`` returns the
  held-back text and the errors at the end (a call still open is an error). A call naming a tool
  not in ``tools`` or whose arguments are not a JSON object is an error, not a call. With
  ``invalid_as_text``, an invalid call's raw text is returned as text (the OpenAI API shows it),
  else it is dropped (the agent never speaks it).
- ``grammar(functions, parallel)``: a Lark grammar (llguidance's dialect) whose every sentence is
  one call (``parallel``: one or more) of one of ``functions`` with arguments valid under its
  schema, and nothing else: what ``tool_choice`` ``"required"`` or a named function enforces.
- ``system_prompt(functions)``: the instructions that declare the tools, for a chat template that
  does not render ``tools`` itself; ``render_calls(calls)``: an assistant turn's past calls as the
  model writes them; ``render_result(text)``: a ``tool`` message's content as the format expects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from execstate.tool_calls.call import FunctionSpec, ToolCall


class ToolCallStream(ABC):
    @abstractmethod
    def feed(self, text: str) -> tuple[str, list[ToolCall], list[str]]: ...

    @abstractmethod
    def end(self) -> tuple[str, list[str]]: ...


class ToolParser(ABC):
    name: str

    @abstractmethod
    def stream(self, tools: Iterable[str], invalid_as_text: bool = False) -> ToolCallStream: ...

    @abstractmethod
    def grammar(self, functions: list[FunctionSpec], parallel: bool) -> str: ...

    @abstractmethod
    def system_prompt(self, functions: list[FunctionSpec]) -> str: ...

    @abstractmethod
    def render_calls(self, calls: list[ToolCall]) -> str: ...

    @abstractmethod
    def render_result(self, text: str) -> str: ...

    def parse(self, text: str, tools: Iterable[str]) -> tuple[str, list[ToolCall], list[str]]:
        """A whole output: ``(text outside the calls, calls, errors)``."""
        s = self.stream(tools)
        content, calls, errors = s.feed(text)
        rest, end_errors = s.end()
        return content + rest, calls, errors + end_errors
