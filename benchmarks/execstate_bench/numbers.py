"""Summaries of measured numbers and their text form, shared by the benchmark reports.

Missing values are ``None`` (a figure that could not be measured) or NaN (a clock or a
load average the platform does not have): summaries skip them, text shows ``-``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def median(xs: Iterable[float | None]) -> float | None:
    """Median of the values that are neither ``None`` nor NaN; ``None`` when there are none."""
    ys = [x for x in xs if x is not None and x == x]
    return statistics.median(ys) if ys else None


def fmt(x: float | None, spec: str = ".3f") -> str:
    """``x`` formatted with ``spec``, or ``-`` when it is missing."""
    return "-" if x is None else format(x, spec)


def span(xs: Iterable[float], spec: str = ".1f") -> str:
    """``min..max`` of a non-empty series (e.g. the load averages seen before each run)."""
    ys = list(xs)
    return f"{format(min(ys), spec)}..{format(max(ys), spec)}"
