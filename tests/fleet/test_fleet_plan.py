"""``execstate serve MODEL --ray --replicas N`` keeps its promise (no cluster needed here; the slow
test, tests/fleet/test_ray_cli_fleet.py, runs the CLI on a real local cluster):

- the replicas' CPU share is sized to the cluster (3 replicas on 2 CPUs: 0.66 each, where each
  reserved 1 CPU before and the third was never scheduled), and a count that would get less than a
  quarter CPU each is refused, exit status 2, with the largest count that fits, before Ray starts;
- a single-machine fleet turns on Ray's loopback-only mode before Ray is imported, unless
  ``--ray-address`` or a non-loopback ``--replica-host`` say the fleet spans hosts;
- the deployment is watched, not awaited: the ready line once it runs, a redeploy when Serve gives
  up on it (``DEPLOY_FAILED``: a replica that died while deploying), and never an exception for
  the application's state (before, ``serve.run`` raised and the process, with its ingress, ended).
"""

from __future__ import annotations

import os
import types

import pytest

from execstate.cli import main
from execstate.fleet.cluster_plan import LOCAL_ONLY_ENV, FleetPlanError, keep_local, local_only, replica_cpus


def forget_local_only(monkeypatch) -> None:
    """Unset Ray's local-only switch and UCX's loopback-only device for this test, restored after
    it (keep_local sets both in this process: left set, they would reach every later test's
    children, e.g. NIXL across network namespaces)."""
    for name in (LOCAL_ONLY_ENV, "UCX_NET_DEVICES"):
        monkeypatch.setenv(name, "restore-me")
        monkeypatch.delenv(name)


@pytest.mark.parametrize(("replicas", "cpus", "share"), [(1, 2, 1.0), (2, 2, 1.0), (3, 2, 0.66), (8, 2, 0.25),
                                                          (4, 16, 1.0), (7, 3, 0.42)])
def test_the_share_fits_the_cpus(replicas, cpus, share):
    assert replica_cpus(replicas, cpus) == share
    assert replicas * replica_cpus(replicas, cpus) <= max(cpus, replicas)  # never more than the cluster has


@pytest.mark.parametrize(("replicas", "cpus", "most"), [(9, 2, 8), (100, 4, 16)])
def test_too_many_replicas_are_refused_naming_what_fits(replicas, cpus, most):
    with pytest.raises(FleetPlanError, match=f"at most {most} replicas"):
        replica_cpus(replicas, cpus)
    for bad in ((0, 2), (2, 0)):
        with pytest.raises(FleetPlanError):
            replica_cpus(*bad)


def test_the_cli_refuses_before_starting_ray(monkeypatch, capsys, tmp_path):
    pytest.importorskip("ray")
    import ray

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray was started for a fleet that cannot fit"))
    forget_local_only(monkeypatch)
    assert main(["serve", str(tmp_path), "--ray", "--replicas", "9"]) == 2
    err = capsys.readouterr().err
    assert "--replicas 9" in err and "at most 8 replicas" in err


def test_a_single_machine_fleet_is_loopback_only(monkeypatch):
    assert local_only(None, "127.0.0.1") and local_only(None, "localhost")
    assert not local_only("10.0.0.1:6379", "127.0.0.1") and not local_only(None, "node")
    assert not local_only(None, "10.0.0.7")
    forget_local_only(monkeypatch)
    assert not keep_local(None, "node") and LOCAL_ONLY_ENV not in os.environ
    assert keep_local(None, "127.0.0.1") and os.environ[LOCAL_ONLY_ENV] == "0"


class FakeServe:
    """``serve._run`` and ``serve.status`` of a deployment that goes through ``states``."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.deploys = 0

    def _run(self, app, _blocking, name, route_prefix):
        assert _blocking is False
        self.deploys += 1

    def status(self):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        app = types.SimpleNamespace(status=state, message="replica died" if state == "DEPLOY_FAILED" else "")
        return types.SimpleNamespace(applications={"execstate": app})


def test_watch_redeploys_a_failed_deployment_and_never_raises_for_it(monkeypatch, capsys):
    pytest.importorskip("ray")
    from execstate.fleet.ray_app import app as fleet

    fake = FakeServe(["DEPLOYING", "DEPLOY_FAILED", "DEPLOY_FAILED", "DEPLOYING", "RUNNING", "UNHEALTHY",
                      "RUNNING"])
    monkeypatch.setattr(fleet, "serve", fake)
    clock = [0.0]
    monkeypatch.setattr(fleet.time, "monotonic", lambda: clock[0])
    polls = [0]

    def sleep(s: float) -> None:
        clock[0] += 10.0  # each poll: 10 s later, past the first backoff
        polls[0] += 1
        if polls[0] >= 8:
            raise KeyboardInterrupt  # the operator stops it

    monkeypatch.setattr(fleet.time, "sleep", sleep)
    with pytest.raises(KeyboardInterrupt):
        fleet.watch_fleet(object(), "READY LINE")
    out = capsys.readouterr().out
    assert out.count("READY LINE") == 1  # once, when it first ran
    assert fake.deploys == 2  # the first deploy, and one redeploy after it failed
