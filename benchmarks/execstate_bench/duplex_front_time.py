"""Where a front step's time goes (``execstate bench duplex``, the load part): the agent's own step
windows (``AgentStats.step_at`` / ``step_s``) against the engine's step trace
(``engine/step_trace.py``), both on ``time.monotonic``.

A front step is matched to the first interactive engine request that arrived inside its window (a
drafted first step ran none: skipped). Its wall time splits, with no overlap and no remainder, into:

- ``wait_in_flight_ms``: engine steps without the request (batch work, or a speculation) that ran
  between the agent's call and the request's first step: the engine thread takes a command only
  between steps, so a step running when the agent calls is waited out before the request arrives;
- ``host_in_ms``: the rest of the time from the agent's call to the request's arrival on the
  engine thread (the session call through the event loop and the engine's command queue);
- ``wait_engine_ms``: the rest of the wait from its arrival to its first step (commands, output
  delivery between steps on the engine thread);
- ``forward_ms``: the steps that served it, of which ``forward_off_cpu_ms`` the engine thread was
  not running (descheduled or waiting for the GIL: wall minus ``thread_time``);
- ``between_ms``: from its first step's start to its last step's end, outside those steps (other
  steps, commands and delivery between them); ``batch_steps_between`` counts steps with no
  interactive tokens in there;
- ``host_out_ms``: from its last step's end to the agent's step end (the output's delivery through
  the event loop to the agent).

Each component: ``per_step_ms`` (one row per matched step, ``COMPONENTS`` in order), mean (but
for ``forward_off_cpu_ms``, part of ``forward_ms``, the means add up to the matched steps' mean)
and p50 over the matched steps; ``step_ms`` is the mean of every step, drafted ones too. Beside
them, ``batch_only_step_ms``: the steps that served no interactive request, their wall p50/mean
and how much of it off CPU (what a front step arriving mid-step waits out).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from execstate.engine.step_trace import TracedStep
from execstate_bench.duplex_metrics import pct

COMPONENTS = ("host_in_ms", "wait_in_flight_ms", "wait_engine_ms", "forward_ms", "forward_off_cpu_ms",
              "between_ms", "host_out_ms")


def _ms(v: float) -> float:
    return round(v * 1000.0, 2)


def _overlap(steps: Sequence[TracedStep], lo: float, hi: float) -> float:
    return sum(max(0.0, min(s.t1, hi) - max(s.t0, lo)) for s in steps)


def split_step(a: float, d: float, rid: str, arrival: float, steps: Sequence[TracedStep]) -> dict[str, float]:
    """One front step's components in seconds (module docstring): the agent's window ``[a, a + d]``,
    its engine request ``rid`` that arrived at ``arrival``, and the trace's steps in time order."""
    served = [s for s in steps if any(r == rid for r, _ in s.interactive)]
    if not served:
        raise ValueError(f"request {rid!r} was never served by a traced step")
    first, last = served[0], served[-1]
    # the engine thread takes the request's command only between steps: a step running when the
    # agent called (or started before the request arrived) is waited out before the arrival too
    others = [s for s in steps if s not in served]
    in_before, in_after = _overlap(others, a, arrival), _overlap(others, arrival, first.t0)
    forward = sum(s.wall_s for s in served)
    inside = [s for s in others if first.t0 <= s.t0 and s.t1 <= last.t1]
    return {"host_in_ms": arrival - a - in_before, "wait_in_flight_ms": in_before + in_after,
            "wait_engine_ms": first.t0 - arrival - in_after, "forward_ms": forward,
            "forward_off_cpu_ms": sum(s.off_cpu_s for s in served),
            "between_ms": last.t1 - first.t0 - forward, "host_out_ms": a + d - last.t1,
            "batch_steps_between": float(sum(1 for s in inside if s.interactive_tokens == 0))}


def front_time(step_at: Sequence[float], step_s: Sequence[float], steps: Sequence[TracedStep]) -> dict[str, Any]:
    """The breakdown of the agent's front steps (module docstring) over the trace ``steps``."""
    steps = sorted(steps, key=lambda s: s.t0)
    arrivals = sorted({(arr, rid) for s in steps for rid, arr in s.interactive})
    keys = [arr for arr, _ in arrivals]
    rows: list[dict[str, float]] = []
    for a, d in zip(step_at, step_s, strict=True):
        i = bisect.bisect_left(keys, a)
        if i == len(keys) or keys[i] > a + d:
            continue  # a drafted step: no engine request
        arrival, rid = arrivals[i]
        window = [s for s in steps if s.t1 >= arrival - 1.0 and s.t0 <= a + d]
        rows.append(split_step(a, d, rid, arrival, window))
    out: dict[str, Any] = {"n": len(rows), "per_step_ms": [[_ms(r[k]) for k in COMPONENTS] for r in rows],
                           "step_ms": {"mean": _ms(sum(step_s) / len(step_s)) if step_s else None}}
    for k in (*COMPONENTS, "batch_steps_between"):
        vals = [r[k] for r in rows]
        if k == "batch_steps_between":
            out[k] = {"mean": round(sum(vals) / len(vals), 2) if vals else None}
            continue
        out[k] = {"mean": _ms(sum(vals) / len(vals)) if vals else None, "p50": pct(vals, 50)}
    batch = [s for s in steps if s.interactive_tokens == 0]
    out["batch_only_step_ms"] = {
        "n": len(batch), "p50": pct([s.wall_s for s in batch], 50),
        "mean": _ms(sum(s.wall_s for s in batch) / len(batch)) if batch else None,
        "off_cpu_mean": _ms(sum(s.off_cpu_s for s in batch) / len(batch)) if batch else None}
    return out
