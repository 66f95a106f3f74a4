"""Greedy token agreement between two runs of the same prompts (the engine and a peer, or
a single instance and the PD path): counts, accumulated over repeats, and summaries."""

from __future__ import annotations

from typing import Any


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts at
    the shorter length); ``None`` when they are equal."""
    n = min(len(a), len(b))
    first = next((k for k in range(n) if a[k] != b[k]), None)
    if first is None and len(a) != len(b):
        return n
    return first


def compare(ref: list[list[int]], other: list[list[int]]) -> dict[str, int | None]:
    """Position-wise greedy token agreement over the common length of each pair
    (``first_divergence``: the earliest differing position, ``None`` when all agree)."""
    total = same = seq_same = 0
    first_div: list[int] = []
    for a, b in zip(ref, other, strict=True):
        n = min(len(a), len(b))
        d = first_divergence(a[:n], b[:n])
        total += n
        same += sum(x == y for x, y in zip(a[:n], b[:n], strict=True))
        seq_same += d is None
        if d is not None:
            first_div.append(d)
    return {"tokens": total, "identical": same, "sequences": len(ref), "sequences_identical": seq_same,
            "first_divergence": min(first_div) if first_div else None}


def add_counts(acc: dict[str, int | None], c: dict[str, int | None]) -> None:
    """Add the counts of one ``compare`` to ``acc`` (``first_divergence``: the minimum, ``None``
    while no pair has diverged)."""
    for k, v in c.items():
        if k == "first_divergence":
            old = acc.get(k)
            acc[k] = v if old is None else old if v is None else min(old, v)
        else:
            acc[k] = (acc.get(k) or 0) + (v or 0)


def summarise(c: dict[str, int | None]) -> dict[str, Any]:
    """Accumulated counts plus ``identical_fraction`` (``None`` when no token was compared)."""
    out: dict[str, Any] = dict(c)
    identical, tokens = c["identical"], c["tokens"]
    out["identical_fraction"] = identical / tokens if tokens and identical is not None else None
    return out
