"""Metrics of played conversations (``duplex_run.Played``), as docs/contracts.md 9 and the
issue define them:

- response latency: end of the user's turn (the script's last chunk) -> first output word of the
  reply to it;
- interruption latency: barge-in accepted -> last word of the old epoch emitted (0 when nothing
  of the old epoch came after the acceptance); *stop latency*: barge-in accepted -> the front's
  cancelled step ended (the engine released the front for the new epoch);
- delegation latency: delegation created -> result appended to the front's context -> first word
  of the response that speaks it; *correct*: that response contains the known answer;
- TOR on pauses (Full-Duplex-Bench pause handling): share of mid-utterance pauses in which the
  agent started a reply; false interruptions on backchannels: share of backchannels said while the
  agent spoke whose response was then cancelled; resume latency: the backchannel -> the first
  word of the same response after the agent resumed (the hold ends ``resume_after_s`` after it);
- front step latency p50 / p99 (every front step of the run).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from execstate.agent.agent_events import (
    DelegationCreated,
    DelegationResult,
    OutputDelta,
    ResponseCreated,
    ResponseDone,
    TurnEvent,
)
from execstate_bench.duplex_run import Played


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.asarray(xs) * 1000, q)), 1) if xs else None


def summarize(runs: list[Played]) -> dict[str, Any]:
    resp, intr, stop, d_app, d_first, correct, tor, bc, resume, steps = [], [], [], [], [], [], [], [], [], []
    for p in runs:
        ev = p.events
        deltas = [e for e in ev if isinstance(e, OutputDelta)]
        created = {e.response_id: e for e in ev if isinstance(e, ResponseCreated)}
        done = {e.response_id: e for e in ev if isinstance(e, ResponseDone)}
        steps += p.step_s
        for m in p.marks:
            if m["kind"] == "turn_end":
                nxt = next((e for e in ev if isinstance(e, ResponseCreated) and e.t >= m["t"] - 1e-9), None)
                first = next((d for d in deltas if nxt is not None and d.response_id == nxt.response_id), None)
                if first is not None and m["during"] != "backchannel":
                    resp.append(first.t - m["t"])
            elif m["kind"] == "pause":
                tor.append(any(isinstance(e, ResponseCreated) and e.cause == "turn" and m["t0"] < e.t <= m["t1"]
                               for e in ev))
            elif m["kind"] == "backchannel" and m["active"]:
                r = done.get(m["response_id"])
                bc.append(r is not None and r.status == "cancelled")
                turn = next((e for e in ev if isinstance(e, TurnEvent) and e.kind == "resume" and e.t > m["t"]), None)
                again = next((d for d in deltas if turn is not None and d.response_id == m["response_id"]
                              and d.t >= turn.t), None)
                if again is not None:
                    resume.append(again.t - m["t"])
            elif m["kind"] == "question":
                spoken = [e for e in ev if isinstance(e, DelegationResult) and e.appended and e.t > m["t"]]
                res = next((e for e in ev if isinstance(e, DelegationResult) and e.t > m["t"]), None)
                dc = next((e for e in ev if isinstance(e, DelegationCreated) and e.t > m["t"]), None)
                sr = next(
                    (c for c in created.values() if c.cause == "result" and res is not None and c.t >= res.t), None
                )
                text = done[sr.response_id].text if sr is not None and sr.response_id in done else ""
                correct.append(bool(spoken) and m["answer"] in text)
                if dc is not None and res is not None and res.appended:
                    d_app.append(res.t - dc.t)
                    fw = next((d for d in deltas if sr is not None and d.response_id == sr.response_id), None)
                    if fw is not None:
                        d_first.append(fw.t - res.t)
        for t_acc, old, t_end in p.interrupts:
            last = max((d.t for d in deltas if d.epoch == old), default=t_acc)
            intr.append(max(0.0, last - t_acc))
            if t_end is not None:
                stop.append(t_end - t_acc)
    return {
        "response_latency_ms": {"p50": pct(resp, 50), "p90": pct(resp, 90), "n": len(resp)},
        "interruption_latency_ms": {"p50": pct(intr, 50), "p99": pct(intr, 99), "n": len(intr)},
        "stop_latency_ms": {"p50": pct(stop, 50), "p99": pct(stop, 99), "n": len(stop)},
        "delegation_ms": {"created_to_appended_p50": pct(d_app, 50), "appended_to_first_word_p50": pct(d_first, 50),
                          "appended_to_first_word_p99": pct(d_first, 99), "n": len(d_app)},
        "delegated_correct": {"share": round(sum(correct) / len(correct), 3) if correct else None, "n": len(correct)},
        "tor_pauses": {"rate": round(sum(tor) / len(tor), 3) if tor else None, "n": len(tor)},
        "false_interruptions_backchannel": {"rate": round(sum(bc) / len(bc), 3) if bc else None, "n": len(bc),
                                            "resume_ms_p50": pct(resume, 50), "resume_ms_max": pct(resume, 100)},
        "front_step_ms": {"p50": pct(steps, 50), "p99": pct(steps, 99), "n": len(steps)},
    }
