"""A tool call and a tool's declaration (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool (function) name and its arguments (a JSON object)."""

    tool: str
    arguments: dict[str, Any]

    @property
    def name(self) -> str:
        return self.tool


@dataclass(frozen=True)
class FunctionSpec:
    """A function tool as OpenAI's ``tools`` entries declare it."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})

    @classmethod
    def from_openai(cls, tool: dict[str, Any]) -> FunctionSpec:
        """From ``{"type": "function", "function": {"name", "description"?, "parameters"?}}``;
        ValueError naming what is wrong."""
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ValueError("only tools of type 'function' are supported")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError("a tool needs function.name (a non-empty string)")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object"}
        if not isinstance(params, dict):
            raise ValueError(f"function {fn['name']!r}: parameters must be a JSON Schema object")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ValueError(f"function {fn['name']!r}: description must be a string")
        return cls(fn["name"], desc, params)

    def to_openai(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            fn["description"] = self.description
        return {"type": "function", "function": fn}
