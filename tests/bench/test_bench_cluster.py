"""``execstate bench cluster``: the workload is the same for every router (pure, fast); the report's
numbers from a summary of known turns (fast); a tiny run on a local Ray cluster (slow: Ray and one
deployment per (replicas, router) take over 30 s)."""

from __future__ import annotations

import json

import pytest

from execstate_bench.cluster import summarize
from execstate_bench.cluster_report import format_cluster_table, plot_cluster
from execstate_bench.cluster_workload import ClusterWorkload, Turn


def test_workload_is_deterministic_and_shares_system_prompts():
    w = ClusterWorkload(users=6, systems=2, system_len=64, turns=2, session_users=1)
    assert w.requests == 12
    assert w.system_prompt(0) == ClusterWorkload(users=6, systems=2, system_len=64).system_prompt(0)
    assert w.system_prompt(0) != w.system_prompt(1) and len(w.system_prompt(1)) == 64
    assert [w.system_of(u) for u in range(4)] == [0, 1, 0, 1]
    assert w.user_turn(0, 0) != w.user_turn(0, 1) != w.user_turn(1, 1)
    assert [w.is_session(u) for u in range(3)] == [True, False, False]
    with pytest.raises(ValueError):
        ClusterWorkload(session_users=40, users=4)


def test_summary_counts_hits_per_replica_and_percentiles():
    turns = [Turn(0, 0, "completion", 0.0, ttft=0.1, latency=0.3, tokens=4, replica="a"),
             Turn(1, 0, "completion", 0.0, ttft=0.3, latency=0.5, tokens=4, replica="b"),
             Turn(2, 0, "completion", 0.1, ttft=None, latency=0.2, tokens=0, replica="b", error="cut"),
             Turn(3, 0, "session", 0.0, ttft=0.2, latency=0.2, tokens=4, replica="a")]
    before = {"a": {"prefix_hit_tokens": 10, "prefix_lookup_tokens": 100}, "b": {}}
    after = {"a": {"prefix_hit_tokens": 70, "prefix_lookup_tokens": 200},
             "b": {"prefix_hit_tokens": 0, "prefix_lookup_tokens": 100}}
    s = summarize(turns, 2.0, before, after)
    assert (s["requests"], s["errors"]) == (4, 1)
    assert s["ttft_p50_ms"] == pytest.approx(200.0) and s["ttft_p99_ms"] == pytest.approx(298.0)
    assert s["tokens_per_s"] == pytest.approx(6.0)
    assert s["prefix_hit_rate"] == pytest.approx(60 / 200)
    assert s["per_replica"]["a"] == {"requests": 2, "hit_tokens": 60, "lookup_tokens": 100, "hit_rate": 0.6}
    assert s["per_replica"]["b"]["requests"] == 2


@pytest.mark.slow
def test_a_tiny_cluster_run(tmp_path):
    pytest.importorskip("ray")
    from execstate_bench.cluster import run_cluster_bench

    w = ClusterWorkload(users=4, systems=1, system_len=128, turns=2, session_users=1, concurrency=2, reply_len=4)
    report = run_cluster_bench(replicas=(1, 2), routers=("round_robin", "execstate"), workload=w)
    json.dumps(report)
    runs = {(r["replicas"], r["router"]): r for r in report["runs"]}
    assert set(runs) == {(1, "any"), (2, "round_robin"), (2, "execstate")}
    for r in runs.values():
        assert r["errors"] == 0 and r["requests"] == 8 and r["ttft_p50_ms"] > 0
        assert sum(p["requests"] for p in r["per_replica"].values()) == 8
    assert min(p["requests"] for p in runs[(2, "round_robin")]["per_replica"].values()) >= 2  # turns alternate
    # one system prompt, every turn after the first user's sees it cached on the replica it goes to
    assert runs[(2, "execstate")]["prefix_hit_rate"] >= runs[(2, "round_robin")]["prefix_hit_rate"]
    assert runs[(1, "any")]["prefix_hit_rate"] > 0.5
    assert "execstate" in format_cluster_table(report)
    plot_cluster(report, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 10_000
