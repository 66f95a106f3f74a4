"""What a request constrains its output to: vLLM's ``StructuredOutputsParams`` (pure Python).

Exactly one of ``json`` (a JSON Schema, as a dict or its JSON text), ``regex``, ``choice`` (a list
of strings: the output is one of them), ``grammar`` (a Lark grammar, or an EBNF / GBNF grammar
with ``::=`` rules, converted to Lark) or ``json_object`` (any JSON object) is set; otherwise
``ValueError``. ``key`` is the canonical text of the constraint (compact JSON, keys in the order
given: a schema's property order is the order its output writes them, so it is part of the
constraint), the compiler's cache key; ``to_wire`` / ``from_wire`` give the serialisable form
that travels with a session's state (migration, hibernation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"invalid structured_outputs: exactly one of {', '.join(KINDS)} must be set, got "
                f"{', '.join(given) if given else 'none'}")
        if isinstance(self.json, str):
            try:
                parsed = json.loads(self.json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"invalid structured_outputs: json is not valid JSON: {exc.msg}") from None
            if not isinstance(parsed, dict | bool):
                raise ValueError("invalid structured_outputs: json must be a JSON Schema object")
        elif self.json is not None and not isinstance(self.json, dict):
            raise ValueError("invalid structured_outputs: json must be a JSON Schema object")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError("invalid structured_outputs: regex must be a string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError("invalid structured_outputs: grammar must be a non-empty string")
        if self.choice is not None and (
            not isinstance(self.choice, list) or not self.choice
            or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError("invalid structured_outputs: choice must be a non-empty list of non-empty strings")
        if self.json_object not in (None, True, False):
            raise ValueError("invalid structured_outputs: json_object must be a boolean")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def value(self) -> Any:
        v = getattr(self, self.kind)
        if self.kind == "json" and isinstance(v, str):
            return json.loads(v)
        return v

    @cached_property
    def key(self) -> str:
        """Canonical text of the constraint (equal constraints give equal keys; computed once)."""
        return json.dumps([self.kind, self.value], separators=(",", ":"), ensure_ascii=False)

    def to_wire(self) -> str:
        return self.key

    @classmethod
    def from_wire(cls, text: str) -> StructuredOutputsParams:
        """The inverse of ``to_wire``; ValueError on anything else."""
        try:
            kind, value = json.loads(text)
        except (json.JSONDecodeError, TypeError, ValueError):
            raise ValueError("invalid structured_outputs wire form") from None
        if kind not in KINDS:
            raise ValueError(f"invalid structured_outputs wire form: unknown kind {kind!r}")
        return cls(**{kind: value})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StructuredOutputsParams:
        """From a request body's ``structured_outputs`` object (unknown keys: ValueError)."""
        unknown = sorted(set(d) - set(KINDS))
        if unknown:
            raise ValueError(f"invalid structured_outputs: unknown field(s) {', '.join(unknown)}")
        return cls(**d)
