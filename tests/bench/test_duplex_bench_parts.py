"""``bench duplex`` pieces without a model: the scripted conversations and the metrics on a
hand-built event log with known answers."""

from __future__ import annotations

import pytest

from execstate.agent.agent_events import (
    DelegationCreated,
    DelegationResult,
    OutputDelta,
    ResponseCreated,
    ResponseDone,
)
from execstate.engine.config import EngineConfig
from execstate_bench.duplex import format_duplex_table, load_plan
from execstate_bench.duplex_front_time import COMPONENTS
from execstate_bench.duplex_metrics import summarize
from execstate_bench.duplex_run import Played
from execstate_bench.duplex_script import BACKCHANNELS, make_conversation


def test_conversations_are_seeded_and_well_formed():
    a, b = make_conversation(3, 8), make_conversation(3, 8)
    assert a == b and a != make_conversation(4, 8)
    assert sorted(t.kind for t in a.turns) == ["backchannel"] * 2 + ["barge_in"] * 2 + ["delegated"] * 2 + ["plain"] * 2
    for t in a.turns:
        assert t.chunks[0].gap_s == 0.0 and all(0 < c.gap_s < 0.8 for c in t.chunks[1:])
        assert t.chunks[-1].text.endswith((".", "?")) and not any(c.text.endswith((".", "?")) for c in t.chunks[:-1])
        assert all(i > 0 for i, c in enumerate(t.chunks) if c.pause)  # a pause is mid-utterance
        if t.kind == "backchannel":
            assert len(t.interruption) == 1 and t.interruption[0].text in BACKCHANNELS
            assert len(t.interruption[0].text.split()) <= 2
        if t.kind == "barge_in":
            assert sum(len(c.text.split()) for c in t.interruption) > 2
        if t.kind == "delegated":
            text = " ".join(c.text for c in t.chunks)
            assert t.answer is not None and (t.answer == str(eval(text.split("is ")[1].rstrip("?").replace(
                "times", "*"))) if t.tool == "calc" else t.answer == a.codes[text.split()[-1].rstrip("?")])


def test_metrics_on_a_known_log():
    ev = [
        ResponseCreated(1.2, 0, "r1", "turn"), DelegationCreated(1.2, 0, "d1", "calc", {"a": "6", "b": "7"}),
        OutputDelta(1.5, 0, "r1", " Let me check."), DelegationResult(2.2, 0, "d1", "completed", "42", appended=True),
        ResponseDone(2.2, 0, "r1", "done", "result", " Let me check."), ResponseCreated(2.2, 0, "r2", "result"),
        OutputDelta(2.25, 0, "r2", " The answer is 42."), ResponseDone(3.0, 0, "r2", "done", "length",
                                                                      " The answer is 42."),
        ResponseCreated(4.1, 0, "r3", "turn"), OutputDelta(4.4, 0, "r3", " Once"),
        OutputDelta(4.9, 0, "r3", " upon"), ResponseDone(5.0, 1, "r3", "cancelled", "barge_in", " Once upon"),
    ]
    marks = [{"kind": "question", "t": 0.0, "answer": "42", "tool": "calc"},
             {"kind": "turn_end", "t": 1.0, "during": "delegated"},
             {"kind": "pause", "t0": 3.2, "t1": 3.8}, {"kind": "turn_end", "t": 4.0, "during": "plain"}]
    s = summarize([Played(ev, marks, [0.1, 0.2, 0.3], [(4.8, 0, 4.95)])])
    assert s["response_latency_ms"] == {"p50": 450.0, "p90": 490.0, "n": 2}  # 0.5 s and 0.4 s
    assert s["delegated_correct"] == {"share": 1.0, "n": 1}
    assert s["delegation_ms"]["created_to_appended_p50"] == 1000.0
    assert s["delegation_ms"]["appended_to_first_word_p50"] == pytest.approx(50.0)
    assert s["interruption_latency_ms"]["p99"] == pytest.approx(100.0)  # " upon" came 0.1 s after the accept
    assert s["stop_latency_ms"]["p50"] == pytest.approx(150.0)
    assert s["tor_pauses"] == {"rate": 0.0, "n": 1}
    assert s["front_step_ms"]["p50"] == 200.0


def test_the_load_plan_gives_the_budgets_their_own_no_load_baseline():
    default, hold = EngineConfig.interactive_batch_budget, EngineConfig.interactive_hold_s
    assert hold > 0
    assert load_plan(5) == [("no_load", "no_load", default, hold, 5),
                            ("load_front_interactive", "load_front_interactive", default, hold, 6),
                            ("load_front_interactive_no_budget", "load_front_interactive_no_budget", None, hold, 7),
                            ("load_front_batch", "load_front_batch", default, hold, 8),
                            ("load_front_interactive_no_hold", "load_front_interactive", default, 0.0, 6)]
    plan = load_plan(5, (4, 0))
    assert plan[5:] == [("load_front_interactive_budget_4", "load_front_interactive", 4, hold, 6),
                        ("load_front_interactive_budget_0", "load_front_interactive", 0, hold, 6),
                        ("no_load_interactive_conversation", "no_load", default, hold, 6)]


def test_the_table_names_each_load_modes_latency_throughput_and_where_the_time_went():
    mode = {"front_step_ms": {"p50": 91.9, "p99": 141.5, "max": 150.0, "n": 32}, "back_end_tasks_per_s": 11.777,
            "front_time": {"n": 32, **{k: {"mean": float(i), "p50": float(i)} for i, k in enumerate(COMPONENTS)}}}
    table = format_duplex_table({"model": "m", "step_tokens": 4, "threads": 1, "cpu": "c",
                                 "load": {"tasks": 10, "max_num_seqs": 8, "load_front_interactive": mode}})
    line = table.splitlines()[-1]
    assert line.split()[0] == "load_front_interactive"
    assert ("front step p50 91.9 / p99 141.5 ms (n 32); back-end tasks/s 11.777; means, ms: host_in 0.0, "
            "wait_in_flight 1.0, wait_engine 2.0, forward 3.0, forward_off_cpu 4.0, between 5.0, host_out 6.0") in line
