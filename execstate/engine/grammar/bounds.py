"""Bounds on what a request may ask the grammar engine to compile (pure Python, run first).

``check_bounds(spec, bounds)`` raises ``ValueError`` naming the bound for: a constraint whose
canonical text is longer than ``max_spec_bytes`` (schema size), a JSON Schema nested deeper than
``max_depth`` (objects and arrays, counted iteratively: a deep schema cannot exhaust the stack), an
``enum`` or ``choice`` with more than ``max_enum`` items, a regex longer than ``max_regex_chars``.
What these cannot see (a regex or grammar whose automaton explodes) is bounded by llguidance's
own limits (``GrammarBounds.limits``: lexer fuel, grammar size, Earley items per step), which turn
it into a grammar error, and by ``compile_timeout_s``, which the server enforces off its event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from execstate.engine.grammar.spec import StructuredOutputsParams


@dataclass(frozen=True)
class GrammarBounds:
    max_spec_bytes: int = 64 * 1024
    max_depth: int = 32
    max_enum: int = 1024
    max_regex_chars: int = 4096
    compile_timeout_s: float = 5.0
    # llguidance's resource limits (LLParserLimits); smaller than its defaults where a request
    # could otherwise make one compile or one mask step slow.
    initial_lexer_fuel: int = 1_000_000  # ~20 ms of regex construction
    step_lexer_fuel: int = 200_000  # ~15 ms per mask step, worst case
    step_max_items: int = 50_000
    max_grammar_size: int = 200_000
    max_lexer_states: int = 50_000


def check_bounds(spec: StructuredOutputsParams, bounds: GrammarBounds) -> None:
    size = len(spec.key.encode())
    if size > bounds.max_spec_bytes:
        raise ValueError(f"structured output constraint is {size} bytes; at most {bounds.max_spec_bytes} allowed")
    if spec.kind == "json":
        _check_schema(spec.value, bounds)
    elif spec.kind == "choice" and len(spec.choice or []) > bounds.max_enum:
        raise ValueError(f"choice has {len(spec.choice or [])} items; at most {bounds.max_enum} allowed")
    elif spec.kind == "regex" and len(spec.regex or "") > bounds.max_regex_chars:
        raise ValueError(f"regex has {len(spec.regex or '')} characters; at most {bounds.max_regex_chars} allowed")


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar: 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
            deepest = max(deepest, d + 1)
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
            deepest = max(deepest, d + 1)
    return deepest


def _check_schema(schema: Any, bounds: GrammarBounds) -> None:
    depth = json_depth(schema)
    if depth > bounds.max_depth:
        raise ValueError(f"JSON schema is nested {depth} levels deep; at most {bounds.max_depth} allowed")
    stack = [schema]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            enum = v.get("enum")
            if isinstance(enum, list) and len(enum) > bounds.max_enum:
                raise ValueError(f"JSON schema enum has {len(enum)} items; at most {bounds.max_enum} allowed")
            pattern = v.get("pattern")
            if isinstance(pattern, str) and len(pattern) > bounds.max_regex_chars:
                raise ValueError(f"JSON schema pattern has {len(pattern)} characters; at most "
                                 f"{bounds.max_regex_chars} allowed")
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
