"""``execstate bench cluster --scenario sessions``: the drain's and the kill's numbers from known
step records (fast), the timeline plot and table from them; a tiny run on a local Ray cluster
with a real redis-server (slow)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from execstate_bench.cluster_sessions import SessionsScenario, StepRecord, Timeline, summarize_sessions
from execstate_bench.cluster_timeline import format_sessions_table, plot_timeline

OK = 200


def _timeline() -> tuple[Timeline, list[dict]]:
    s = StepRecord
    steps = [
        s("s1", 0.5, 0.6, "A", OK, 2), s("s1", 2.5, 3.1, "A", OK, 3), s("s1", 3.5, 3.6, "B", OK, 4),
        s("s1", 5.0, 5.1, "B", OK, 5), s("s1", 6.0, 6.5, None, 0, None, "RemoteProtocolError"),
        s("s1", 6.6, 7.5, "C", OK, 5),
        s("s2", 0.5, 0.6, "A", OK, 2), s("s2", 3.2, 3.3, "B", OK, 3), s("s2", 5.5, 5.6, "B", OK, 4),
        s("s2", 6.2, 6.3, "C", 404, None, "session_lost"),
        s("s3", 1.0, 1.1, "B", OK, 2), s("s3", 4.0, 4.1, "B", OK, 3), s("s3", 7.0, 7.2, "C", OK, 3),
    ]
    marks = {"origin_wall": 1000.0, "drain_start": 2.0, "drain_end": 3.0, "drained": "A", "kill": 6.0, "victim": "B",
             "on_victim": ["s1", "s2", "s3"], "recovered": False, "end": 8.0,
             "drain": {"seconds": 1.0, "moved": [{"session_id": "s1"}, {"session_id": "s2"}], "failed": [],
                       "idle": True}}
    resumed = [{"session_id": "s1", "from": "B", "to": "C", "step_index": 4, "seconds": 0.3, "at": 1006.4},
               {"session_id": "s3", "from": "B", "to": "C", "step_index": 2, "seconds": 0.2, "at": 1006.9}]
    return Timeline(steps, {"s1": "A", "s2": "A", "s3": "B"}, marks), resumed


def test_drain_and_kill_numbers_from_the_records():
    tl, resumed = _timeline()
    out = summarize_sessions(tl, resumed)
    d, k = out["drain"], out["kill"]
    assert (d["sessions"], d["moved"], d["failed"], d["lost"], d["steps_refused_during"]) == (2, 2, 0, 0, 0)
    assert d["step_gap_max_s"] == pytest.approx(2.7)  # s2: 0.6 -> 3.3, across the drain
    assert (k["sessions"], k["resumed"], k["lost"]) == (3, 2, 1)
    assert k["steps_lost"] == {"s1": 1, "s3": 1}  # s1: last step 5, resumed at its copy of step 4
    assert k["requests_failed"] == 2 and k["errors"] == ["RemoteProtocolError", "session_lost"]
    assert k["recovery_p50_s"] == pytest.approx(1.35) and k["recovery_max_s"] == pytest.approx(1.5)
    assert k["resume_max_s"] == pytest.approx(0.3)

    skipped = replace(tl, steps=[replace(r, step_index=4) if (r.session, r.start) == ("s2", 3.2) else r
                                 for r in tl.steps])  # a step index skipped across the drain: lost
    assert summarize_sessions(skipped, resumed)["drain"]["lost_sessions"] == ["s2"]
    gone = replace(tl, steps=[*tl.steps, StepRecord("s1", 2.9, 3.0, "A", 404, None, "not_found")])
    assert summarize_sessions(gone, resumed)["drain"]["lost_sessions"] == ["s1"]


def test_timeline_plot_and_table(tmp_path):
    tl, resumed = _timeline()
    report = {"model": "tiny", "cpus": 2, "load_before": [3.0], "load_after": [4.0],
              "scenario": asdict(SessionsScenario()), "replicas": {"resumed": resumed},
              "timeline": {"steps": [asdict(s) for s in tl.steps], "homes": tl.homes, "marks": tl.marks},
              **summarize_sessions(tl, resumed)}
    plot_timeline(json.loads(json.dumps(report)), str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 20_000
    text = format_sessions_table(report)
    assert "2 moved, 0 failed, 0 lost" in text and "3 sessions, 2 resumed, 1 lost, 2 steps lost" in text


@pytest.mark.slow
def test_a_tiny_sessions_run(tmp_path):
    pytest.importorskip("ray")
    from execstate_bench.redis_server import redis_server_available

    if not redis_server_available():
        pytest.skip("redis-server is not installed")
    from execstate_bench.cluster_sessions import run_sessions_bench

    sc = SessionsScenario(replicas=3, live_sessions=4, others=1, first_len=32, warm_s=3, settle_s=3)
    report = run_sessions_bench("tiny", sc)
    d, k = report["drain"], report["kill"]
    assert d["sessions"] == 4 and d["moved"] == 4 and d["failed"] == 0 and d["lost"] == 0
    assert k["sessions"] >= 1 and k["lost"] == 0 and k["resumed"] == k["sessions"]
    assert all(n >= 0 for n in k["steps_lost"].values())
    assert k["recovered"] is True
    plot_timeline(report, str(tmp_path / "t.png"))
    json.dumps(report)
