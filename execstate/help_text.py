"""Docstring text made fit for a terminal (``--help``): reStructuredText inline markup removed.

Module docstrings are written for readers of the code, in reStructuredText: ````literal````,
``:class:`~execstate.engine.llm.LLM```` roles, ``*emphasis*``, a ``::`` that opens a literal
block. A command's ``--help`` prints plain text, so :func:`plain` turns each of those into what it
stands for:

- ````x```` -> ``x``; a role ``:kind:`x``` (``:class:``, ``:func:``, ``:meth:``, ...) -> ``x``, and
  ``:kind:`~a.b.C``` -> ``C`` (what Sphinx shows);
- a paragraph's closing ``::`` -> ``:`` (``text::`` opens a literal block in reST);
- nothing else changes (single backquotes, which read as a command on a terminal, stay).
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_BLOCK_OPENER = re.compile(r"(?<=\S)::(?=\s*$)", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2)
    return target.rsplit(".", 1)[-1] if tilde else target


def plain(text: str) -> str:
    """``text`` (a docstring or a part of one) without reStructuredText inline markup (module docstring)."""
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(lambda m: m.group(1), text)
    return _BLOCK_OPENER.sub(":", text)
