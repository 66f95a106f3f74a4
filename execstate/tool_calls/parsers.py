"""Tool-call parsers by name (vLLM's ``--tool-call-parser``); one entry per supported format."""

from __future__ import annotations

from execstate.tool_calls.hermes import HermesToolParser
from execstate.tool_calls.parser import ToolParser

PARSER_NAMES = ("hermes",)


def tool_parser(name: str = "hermes") -> ToolParser:
    """The parser of format ``name``; ValueError naming the known ones."""
    if name == "hermes":
        return HermesToolParser()
    raise ValueError(f"unknown tool call parser {name!r}; known: {', '.join(PARSER_NAMES)}")
