"""Does a Lark grammar match any finite string? A check run before llguidance compiles it.

A grammar whose ``start`` rule has no base case (``start: "a" start``) matches no finite string:
llguidance compiles it, and the first generation then grows the parser's item sets until its
``step_max_items`` limit fails the request mid-generation. :func:`unproductive_rules` finds it
at compile time: a rule is *productive* when one of its alternatives uses only productive rules
(terminals, strings, regexes, ``%json`` and optional or repeated-zero-times items always are);
the productive rules are the least fixed point of that rule, and ``start`` must be among them.

The parser reads the Lark dialect llguidance accepts (rules and tokens, ``|`` alternatives over
several lines, ``( )`` groups, ``[ ]`` options, ``? * +`` and ``{n,m}`` / ``~ n..m`` repeats,
strings, regexes, ``"a".."z"`` ranges, special tokens ``<...>``, ``%json {...}`` / ``%regex
{...}`` items, directives such as ``%ignore`` and ``%llguidance {...}``). It gives a verdict only
on grammars it parsed completely: on anything it does not understand it returns ``None`` and
leaves the grammar to llguidance, so it never refuses a grammar llguidance would accept for a
reason of its own. Pure Python, linear in the grammar's size (bounded by ``GrammarBounds``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+|\\\n)
  | (?P<nl>\n)
  | (?P<comment>//[^\n]*|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<special><\[[^\]\n]*\]>|<[^<>\s]+>)
  | (?P<directive>%[A-Za-z_]+)
  | (?P<name>[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\.-?\d+)?)
  | (?P<number>\d+)
  | (?P<op>::=|\.\.|[:|()\[\]?*+~{},=])
""", re.VERBOSE)


class _Unsupported(Exception):
    """Something the parser does not understand: no verdict."""


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    line_start: bool  # the first token of its line


def _lex(src: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos, line_start = 0, True
    while pos < len(src):
        if src[pos] == "{" and out and out[-1].kind == "directive":
            pos = _skip_braces(src, pos)  # %json {...}, %llguidance {...}: a JSON value, not grammar
            out.append(_Tok("blob", "{}", False))
            continue
        m = _TOKEN.match(src, pos)
        if m is None:
            raise _Unsupported(f"unexpected character {src[pos]!r}")
        kind = m.lastgroup
        assert kind is not None
        pos = m.end()
        if kind == "nl":
            line_start = True
        elif kind not in ("ws", "comment"):
            out.append(_Tok(kind, m.group(), line_start))
            line_start = False
    return out


def _skip_braces(src: str, pos: int) -> int:
    """The index after the JSON object starting at ``pos`` (strings and nesting respected)."""
    depth, i, in_str = 0, pos, False
    while i < len(src):
        c = src[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _Unsupported("unbalanced braces")


# An expansion, reduced to what productivity needs: an alternation of sequences of items, each
# item a rule name, True (always productive: a terminal, or optional) or a nested alternation.
_Expr = list[list["str | bool | _Expr"]]


class _Parser:
    def __init__(self, toks: list[_Tok]) -> None:
        self.toks = toks
        self.i = 0

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def at_definition(self) -> bool:
        """A rule or token definition starts here: ``name:`` / ``name ::=`` at the start of a line."""
        t = self.peek()
        if t is None or not t.line_start or t.kind != "name" or self.i + 1 >= len(self.toks):
            return False
        return self.toks[self.i + 1].text in (":", "::=")

    def rules(self) -> dict[str, _Expr]:
        rules: dict[str, _Expr] = {}
        while (t := self.peek()) is not None:
            if t.kind == "directive":  # %ignore X, %import ..., %llguidance {...}: to the end of its line
                self.i += 1
                while (u := self.peek()) is not None and not u.line_start:
                    self.i += 1
                continue
            if not self.at_definition():
                raise _Unsupported(f"expected a rule definition, got {t.text!r}")
            name = t.text.lstrip("?!").split(".")[0]
            self.i += 2
            body = self.alternation(top=True)
            rules[name] = rules.get(name, []) + body  # a rule defined twice: both bodies
        return rules

    def alternation(self, top: bool = False) -> _Expr:
        alts = [self.sequence(top)]
        while (t := self.peek()) is not None and t.text == "|" and t.kind == "op":
            self.i += 1
            alts.append(self.sequence(top))
        return alts

    def sequence(self, top: bool) -> list[str | bool | _Expr]:
        items: list[str | bool | _Expr] = []
        while (t := self.peek()) is not None:
            if (top and self.at_definition()) or (t.kind == "directive" and t.line_start):
                break
            if t.kind == "op" and t.text in ("|", ")", "]"):
                break
            items.append(self.item())
        return items

    def item(self) -> str | bool | _Expr:
        atom = self.atom()
        t = self.peek()
        if t is None or t.kind != "op":
            return atom
        if t.text in ("?", "*"):
            self.i += 1
            return True
        if t.text == "+":
            self.i += 1
            return atom
        if t.text == "{":
            self.i += 1
            low = self.number()
            while (u := self.peek()) is not None and u.text != "}":
                self.i += 1
            self.expect("}")
            return True if low == 0 else atom
        if t.text == "~":
            self.i += 1
            low = self.number()
            if (u := self.peek()) is not None and u.text == "..":
                self.i += 1
                self.number()
            return True if low == 0 else atom
        return atom

    def number(self) -> int:
        t = self.peek()
        if t is None or t.kind != "number":
            raise _Unsupported("expected a number")
        self.i += 1
        return int(t.text)

    def expect(self, text: str) -> None:
        t = self.peek()
        if t is None or t.text != text:
            raise _Unsupported(f"expected {text!r}")
        self.i += 1

    def atom(self) -> str | bool | _Expr:
        t = self.peek()
        if t is None:
            raise _Unsupported("unexpected end")
        self.i += 1
        if t.kind == "string":
            if (u := self.peek()) is not None and u.text == "..":
                self.i += 1
                if (v := self.peek()) is None or v.kind != "string":
                    raise _Unsupported("expected a range's end")
                self.i += 1
            return True
        if t.kind in ("regex", "special"):
            return True
        if t.kind == "directive":  # %json {...}, %regex {...}, %lark {...} inline
            if (u := self.peek()) is None or u.kind != "blob":
                raise _Unsupported(f"{t.text} without its value")
            self.i += 1
            return True
        if t.kind == "name":
            return t.text
        if t.text == "(":
            inner = self.alternation()
            self.expect(")")
            return inner
        if t.text == "[":
            self.alternation()
            self.expect("]")
            return True
        raise _Unsupported(f"unexpected {t.text!r}")


def unproductive_rules(lark: str, start: str = "start") -> list[str] | None:
    """The rules reachable from ``start`` that match no finite string, when ``start`` is one of them
    (``[]``: the grammar is fine); ``None`` when the grammar could not be analysed (module docstring)."""
    try:
        return _unproductive(_Parser(_lex(lark)).rules(), start)
    except (_Unsupported, RecursionError):
        return None


def _unproductive(rules: dict[str, _Expr], start: str) -> list[str] | None:
    if start not in rules:
        return None
    productive: set[str] = set()

    def ok(x: str | bool | _Expr) -> bool:
        if isinstance(x, bool):
            return x
        if isinstance(x, str):  # a token (upper case) or an undefined name: llguidance judges those
            return x in productive or x not in rules or x.lstrip("_")[:1].isupper()
        return any(all(ok(i) for i in seq) for seq in x)

    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in productive and ok(body):
                productive.add(name)
                changed = True
    if start in productive:
        return []
    reachable, todo = {start}, [rules[start]]
    while todo:
        stack: list[object] = [todo.pop()]
        while stack:
            x = stack.pop()
            if isinstance(x, str) and x in rules and x not in reachable:
                reachable.add(x)
                todo.append(rules[x])
            elif isinstance(x, list):
                stack.extend(x)
    return sorted(r for r in reachable if r not in productive)
