"""The tools the server runs for its agents: a registry of Python callables, and two built-ins.

``AgentTools`` maps a name to a callable taking keyword arguments (a delegation's ``arguments``)
and returning the result (made text with ``str``); ``async def`` callables are awaited on the
server's event loop, plain ones run in a worker thread (``agent/backend.py``), so a slow tool never
blocks the front. Embedding the server, register more before it serves::

    app = build_app(engine, "name")
    app.state.agent.tools.register("weather", lambda city: f"sunny in {city}")

Built in (``builtin_tools``): ``calculator(expression)`` (arithmetic on numbers: ``+ - * / // %
**`` and the words ``plus``, ``minus``, ``times``, ``divided by``; no names, no calls) and
``lookup(key)`` (a fixed table, ``DEMO_TABLE``: facts only the back end knows, to test delegation).
``AgentServer`` adds the back-end model as the tool ``reason(prompt)`` (``agent/backend.py``'s
``ModelTool``).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

DEMO_TABLE = {"zebra": "ZX-4417", "otter": "OT-2290", "falcon": "FA-7731", "heron": "HE-0526"}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_BITS = 1024
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_WORDS = [(r"\bdivided by\b", "/"), (r"\bover\b", "/"), (r"\btimes\b", "*"), (r"\bplus\b", "+"),
          (r"\bminus\b", "-"), (r"(?<=\d)\s*[x×]\s*(?=\d)", "*")]
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """The value of an arithmetic ``expression`` (ValueError naming what is not allowed)."""
    if not isinstance(expression, str) or not expression.strip() or len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression must be a non-empty string of at most {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().rstrip("?.!=").lower()
    for pattern, op in _WORDS:
        text = re.sub(pattern, op, text)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _eval(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return cast(int | float, node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent above {MAX_EXPONENT}")
        if isinstance(node.op, ast.Pow):
            bits = _bits(left) * max(int(right), 1)
        elif isinstance(node.op, ast.Mult):
            bits = _bits(left) + _bits(right)
        else:
            bits = 0
        if bits > MAX_BITS:
            raise ValueError(f"a number above 2**{MAX_BITS}")
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
    raise ValueError(f"not allowed in an expression: {type(node).__name__}")


def _bits(x: int | float) -> int:
    return abs(int(x)).bit_length() if abs(x) < float("inf") else MAX_BITS + 1


def make_lookup(table: Mapping[str, str]) -> Callable[[str], str]:
    """``lookup(key)``: ``table``'s entry for ``key`` (case and spaces ignored); KeyError if none."""
    entries = {k.strip().lower(): str(v) for k, v in table.items()}

    def lookup(key: str) -> str:
        k = str(key).strip().lower()
        if k not in entries:
            raise KeyError(f"no entry for {key!r}")
        return entries[k]

    return lookup


def builtin_tools() -> dict[str, Callable[..., Any]]:
    return {"calculator": calculator, "lookup": make_lookup(DEMO_TABLE)}


def check_tool_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"a tool name is 1-64 of [A-Za-z0-9_.-] starting with a letter or _, got {name!r}")
    return name


class AgentTools:
    """The server-side tool registry (module docstring)."""

    def __init__(self, tools: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self.tools: dict[str, Callable[..., Any]] = {}
        for name, fn in (builtin_tools() if tools is None else tools).items():
            self.register(name, fn)

    def register(self, name: str, fn: Callable[..., Any]) -> None:
        """Add (or replace) the tool ``name``; agents opened afterwards can use it."""
        if not callable(fn):
            raise ValueError(f"tool {name!r} must be callable")
        self.tools[check_tool_name(name)] = fn

    @property
    def names(self) -> list[str]:
        return sorted(self.tools)
