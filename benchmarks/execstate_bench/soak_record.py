"""What ``execstate bench soak`` records over time, and its verdict (no server, no network here).

- :class:`Tally`: every client operation as it ends: its surface (``completions``, ``chat_sse``,
  ``realtime``, ``voice``...), seconds and outcome (an HTTP status, ``ok``, an error code, ``cut``
  for a client that left on purpose). Windowed by the sampler.
- :class:`Sample`: one look at the server every ``period``: RSS, open file descriptors, threads
  (``/proc``), and from ``/metrics``: KV blocks in use, requests running and waiting, tier units
  per tier, sessions by kind and state; with each window's per-surface p50/p99 and outcomes.
- :func:`verdict`: the goals, each with the figures it was judged on:

  - RSS flat after warm-up: every sample after warm-up within ``flat_tolerance`` (5 %) of the first
    sample after warm-up (``max_deviation``: the sample furthest from it, signed);
  - fds flat after warm-up: the mean of the last tenth of the samples within ``flat_tolerance`` of
    the first sample after warm-up (a sample counts the connections open at that moment, so single
    samples swing by a few; ``max_deviation`` is reported too);
  - 0 leaked blocks: none in use once every client left and every session it opened was closed;
  - 0 unexpected 5xx: server errors (HTTP >= 500, a socket's ``server_error``) outside the windows
    of faults that inject them (on ``--ray``: a replica killed);
  - no surface's p99 degrading: each surface's p99 over the last third of the run within 1.5 x
    its p99 over the first third after warm-up, plus 0.5 s.
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SERVER_ERRORS = ("server_error", "request_failed", "engine_dead")


@dataclass
class Op:
    t: float  # seconds since the soak started, when the operation ended
    surface: str
    seconds: float
    outcome: str  # "200", "429", "ok", "cut", a protocol error code...


@dataclass
class Tally:
    ops: list[Op] = field(default_factory=list)

    def add(self, t: float, surface: str, seconds: float, outcome: str | int) -> None:
        self.ops.append(Op(t, surface, seconds, str(outcome)))

    def between(self, t0: float, t1: float) -> list[Op]:
        return [o for o in self.ops if t0 <= o.t < t1]


@dataclass
class Sample:
    t: float
    rss_mb: float
    fds: int
    threads: int
    blocks_used: float
    running: float
    waiting: float
    tier_units: dict[str, float]
    sessions: dict[str, float]
    p50: dict[str, float]
    p99: dict[str, float]
    outcomes: dict[str, int]


def proc_stats(pid: int) -> tuple[float, int, int]:
    """(RSS MB, open fds, threads) of ``pid``; NaN / -1 when it is gone."""
    try:
        rss, threads = float("nan"), -1
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        return rss, len(os.listdir(f"/proc/{pid}/fd")), threads
    except OSError:
        return float("nan"), -1, -1


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """Prometheus text -> ``{name: {label string: value}}`` (``""`` for an unlabelled sample)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name][",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))] = float(s.value)
    return out


def window_stats(ops: list[Op]) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """Per-surface p50 and p99 seconds (successful operations) and ``surface:outcome`` counts."""
    by: dict[str, list[float]] = defaultdict(list)
    outcomes: Counter[str] = Counter()
    for o in ops:
        outcomes[f"{o.surface}:{o.outcome}"] += 1
        if o.outcome in ("200", "ok"):
            by[o.surface].append(o.seconds)
    return ({s: pct(v, 0.5) for s, v in by.items()}, {s: pct(v, 0.99) for s, v in by.items()}, dict(outcomes))


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, math.ceil(q * len(ys)) - 1)] if ys else float("nan")


def is_server_error(outcome: str) -> bool:
    return (outcome.isdigit() and int(outcome) >= 500) or outcome in SERVER_ERRORS


def verdict(samples: list[Sample], tally: Tally, warmup_s: float, end_s: float, leaked_blocks: float,
            injected: list[tuple[float, float]], flat_tolerance: float = 0.05) -> dict[str, Any]:
    """The goals (module docstring): each one's figures and whether it is met."""
    after = [s for s in samples if s.t >= warmup_s] or samples
    tail = after[-max(1, len(after) // 10):]

    def flat(name: str, strict: bool = False) -> dict[str, Any]:
        values = [float(getattr(s, name)) for s in after if not math.isnan(float(getattr(s, name)))]
        base = values[0]
        last = sum(float(getattr(s, name)) for s in tail) / len(tail)
        change = (last - base) / base if base else 0.0
        worst = max(values, key=lambda v: abs(v - base))
        deviation = (worst - base) / base if base else 0.0
        return {"after_warmup": round(base, 1), "end": round(last, 1), "change": round(change, 4),
                "min": round(min(values), 1), "max": round(max(values), 1), "max_deviation": round(deviation, 4),
                "met": abs(deviation if strict else change) <= flat_tolerance}

    unexpected = [asdict(o) for o in tally.ops if is_server_error(o.outcome)
                  and not any(a <= o.t <= b for a, b in injected)]
    third = (end_s - warmup_s) / 3
    first, last = tally.between(warmup_s, warmup_s + third), tally.between(end_s - third, end_s + 1)
    p99_first, p99_last = window_stats(first)[1], window_stats(last)[1]
    trend = {s: {"first_third_p99_s": round(p99_first[s], 3), "last_third_p99_s": round(p99_last[s], 3),
                 "met": p99_last[s] <= 1.5 * p99_first[s] + 0.5}
             for s in sorted(set(p99_first) & set(p99_last))}
    out: dict[str, Any] = {"rss": flat("rss_mb", strict=True), "fds": flat("fds"), "threads": flat("threads"),
           "leaked_blocks": {"value": leaked_blocks, "met": leaked_blocks == 0},
           "unexpected_5xx": {"count": len(unexpected), "first": unexpected[:5], "met": not unexpected},
           "p99_trend": {"surfaces": trend, "met": all(v["met"] for v in trend.values())}}
    out["met"] = all(out[k]["met"] for k in ("rss", "fds", "leaked_blocks", "unexpected_5xx", "p99_trend"))
    return out
