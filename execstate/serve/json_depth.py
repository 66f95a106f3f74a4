"""How deeply a JSON text nests, measured without parsing it (docs/security.md: bounded JSON depth).

Python's ``json`` and msgspec's decoders recurse once per nesting level: a body or frame of
100,000 ``[`` ends in a ``RecursionError`` (a traceback per frame) instead of a clean refusal.
So every JSON the server takes from a client (the HTTP API's bodies: ``body_limit.py``; every
realtime protocol's frames: ``realtime/messages.py``) is measured first and refused beyond
``MAX_JSON_DEPTH`` levels, before a decoder sees it.

``json_depth(raw)`` does its work in numpy on the positions of brackets, quotes and backslashes
(which quotes are escaped, which brackets stand inside strings, a cumulative sum): a few ms per
MiB; ``too_deep`` skips it for a text with too few brackets to be too deep. Brackets inside strings do not count; for
text that is not valid JSON the number is an upper
bound (an unterminated string's brackets count), which the decoder refuses anyway.
"""

from __future__ import annotations

import numpy as np

MAX_JSON_DEPTH = 64
"""Nesting levels (objects and arrays) a client's JSON may have: every message of every protocol
nests at most about 6 deep; 64 leaves room for free-form ``data`` and stays far below the
decoders' recursion limit."""

_OPEN, _CLOSE = b"[{", b"]}"
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of objects and arrays in ``raw`` (0 for a scalar; module docstring)."""
    data = raw.encode() if isinstance(raw, str) else raw
    a = np.frombuffer(data, dtype=np.uint8)
    opens = (a == _OPEN[0]) | (a == _OPEN[1])
    brackets = np.flatnonzero(opens | (a == _CLOSE[0]) | (a == _CLOSE[1]))
    if brackets.size == 0:
        return 0
    if b'"' in data:  # brackets inside strings do not count
        quotes = np.flatnonzero(a == _QUOTE)
        if b"\\" in data:
            quotes = quotes[_unescaped(a, quotes)]
        brackets = brackets[np.searchsorted(quotes, brackets) % 2 == 0]  # an even number of quotes before
    steps = np.where(opens[brackets], 1, -1)
    return int(np.cumsum(steps).max(initial=0))


def _unescaped(a: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """Which of the ``quotes`` are not escaped: an even run of backslashes (maybe none) before each."""
    keep = np.ones(quotes.size, dtype=bool)
    after_slash = np.flatnonzero(a[np.maximum(quotes - 1, 0)] == _BACKSLASH)
    after_slash = after_slash[quotes[after_slash] > 0]
    if after_slash.size == 0:
        return keep
    slashes = np.flatnonzero(a == _BACKSLASH)
    breaks = np.flatnonzero(np.diff(slashes) != 1)
    run_start = slashes[np.concatenate(([0], breaks + 1))]
    run_end = slashes[np.concatenate((breaks, [slashes.size - 1]))]
    ends = quotes[after_slash] - 1  # each the end of a run of backslashes
    i = np.searchsorted(run_end, ends)
    keep[after_slash] = (ends - run_start[i] + 1) % 2 == 0
    return keep


def too_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> int | None:
    """``raw``'s depth when it nests deeper than ``limit``, else ``None`` (no scan for a text with at
    most ``limit`` brackets)."""
    data = raw.encode() if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= limit:
        return None
    depth = json_depth(data)
    return depth if depth > limit else None


def depth_message(depth: int, limit: int = MAX_JSON_DEPTH) -> str:
    return f"JSON nested {depth} levels deep; at most {limit} are accepted"
