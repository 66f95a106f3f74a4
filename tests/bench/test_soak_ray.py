"""``execstate bench soak --ray`` end to end, for 4 minutes (slow: ``execstate serve --ray`` with 2
replicas on a local Ray cluster, its start and a replica's replacement take minutes on 2 cores).

The fleet soak must end with: the fleet process alive; every fault window recorded (the disk
tier's skipped: the CLI's fleet has none); the long streams on the killed replica ended
``replica_failed`` and the others finished; the killed replica's resident sessions each answered
again on the other replica within 30 s of the kill, losing at most the steps after their last copy
(copies every second, a step every two: at most 2), and resumed by the ingress from the victim;
Ray's replacement registered; the rolling update answered 200 with every replica on the new
version, and every resident session, refused ``stale_state`` once after it, reopened; the
version probe answered by both versions, each answer's tokens the independent
oracle's tokens of the version it names (0 wrong-version answers); no unexpected failure, the
injected ones no more than the operations in flight at the kill; no leaked KV block on any replica;
every surface answered; the plot written.
"""

from __future__ import annotations

import pytest

from execstate_bench.redis_server import redis_server_available
from execstate_bench.soak_plot import plot_soak

pytest.importorskip("ray")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_fleet_soak_with_a_replica_killed_and_a_rolling_update(tmp_path):
    if not redis_server_available():
        pytest.skip("redis-server is not installed (the fleet's shared tier)")
    from execstate_bench.soak_ray import RAY_WEIGHTS, run_ray_soak

    report = run_ray_soak(minutes=4.0, clients=3, replicas=2, skip=("voice",))
    fleet, v = report["fleet"], report["verdict"]
    assert fleet["alive_at_end"] and not fleet["client_tasks_crashed"], fleet
    faults = {w["fault"]: w for w in report["faults"]}
    assert set(faults) == {"disk_full", "redis_paused", "redis_full", "redis_stopped", "replica_killed",
                           "rolling_update", "burst"}, faults
    assert all("skipped" not in w["note"] for name, w in faults.items() if name != "disk_full")

    kill = fleet["kill"]
    assert kill["streams_on_victim"] and set(kill["streams_on_victim"]) == {"replica_failed"}, kill
    assert set(kill["streams_elsewhere"]) <= {"ok"}, kill  # the other replica's streams finish
    assert kill["residents_on_victim"] >= 1, kill
    for r in kill["resident_resumes"]:
        assert r["seconds"] is not None and r["seconds"] < 30, r
        assert r["to"] != kill["victim"] and 0 <= r["steps_lost"] <= 2, r
    resumed = {r["session_id"] for r in kill["resumed_by_ingress"]}
    assert {r["session_id"] for r in kill["resident_resumes"]} <= resumed, kill
    assert kill["replacement_registered_s"] is not None, kill

    update = fleet["update"]
    assert update["status"] == 200 and set(update["versions"].values()) == {"user:v1"}, update
    assert fleet["final_versions"] == ["user:v1"]
    # every resident outlived the update: refused stale_state once, reopened, stepped on
    assert fleet["residents"]["reopened_after_stale_state"] == fleet["residents"]["sessions"], fleet["residents"]
    probe = fleet["probe"]
    assert len(probe["by_version"]) == 2 and probe["by_version"]["user:v1"] > 0, probe  # before and after
    assert probe["wrong_version_during_update"] == 0 and probe["wrong_outside_update"] == 0, probe
    versions = {k.split(":", 1)[1] for k in report["totals"] if k.startswith("version_probe:")}
    assert versions == {"200"}, report["totals"]

    errors = fleet["errors"]
    assert errors["unexpected"] == 0, v["unexpected_5xx"]["first"]
    assert len(kill["streams_on_victim"]) <= errors["injected"] <= errors["in_flight_at_kill"], errors
    assert v["leaked_blocks"]["value"] == 0, report["server_problems"]
    want = {"completions", "completions_sse", "chat_sse", "tools", "structured", "echo_logprobs", "sessions_http",
            "realtime", "agent", "resident_sessions", "version_probe"}
    assert set(RAY_WEIGHTS) >= {"voice"}  # offered; left out here for time (the single-server soak runs it)
    ok = {k.split(":")[0] for k, n in report["totals"].items() if k.split(":")[1] in ("200", "ok") and n}
    assert not want - ok, f"surfaces that never answered: {sorted(want - ok)}"
    plot_soak(report, tmp_path / "soak_ray.png")
    assert (tmp_path / "soak_ray.png").stat().st_size > 10_000
