"""``execstate serve --ray``'s cluster options: --ray-address, --replica-host, --replica-resources
(parsing, refusals, and that they are fleet options)."""

from __future__ import annotations

import pytest

from execstate.cli import build_parser, main


def test_the_cluster_options_parse():
    args = build_parser().parse_args(["serve", "m", "--ray", "--ray-address", "10.0.0.1:6379", "--replica-host",
                                      "node", "--replica-resources", '{"execstate_engine": 1, "mem": 0.5}'])
    assert args.ray_address == "10.0.0.1:6379" and args.replica_host == "node"
    assert args.replica_resources == {"execstate_engine": 1.0, "mem": 0.5}
    plain = build_parser().parse_args(["serve", "m", "--ray"])
    assert (plain.ray_address, plain.replica_host, plain.replica_resources) == (None, "127.0.0.1", None)


@pytest.mark.parametrize("bad", ["{", "[1]", '{"a": -1}', '{"a": "1"}', '{"a": true}', "3"])
def test_replica_resources_must_be_an_object_of_amounts(bad, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "m", "--ray", "--replica-resources", bad])
    assert e.value.code == 2 and "--replica-resources" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--ray-address", "auto"], ["--replica-host", "node"],
                                   ["--replica-resources", '{"x": 1}'], ["--fleet-operator", "ops"]])
def test_the_cluster_options_need_ray(extra, capsys):
    assert main(["serve", "m", *extra]) == 2
    err = capsys.readouterr().err
    assert extra[0] in err and "add --ray" in err


def test_the_fleet_honours_the_session_options():
    """--session-idle-ttl reaches the replicas' session settings (it used to be dropped on --ray, so
    sessions a client left open never expired below the fixed default)."""
    pytest.importorskip("ray")
    from execstate.fleet.ray_app.app import fleet_session_settings
    from execstate.serve.app import DEFAULT_IDLE_TTL_S

    args = build_parser().parse_args(["serve", "m", "--ray", "--session-idle-ttl", "30", "--session-copy-every",
                                      "2", "--session-hibernate-after", "45"])
    got = fleet_session_settings(args)
    assert (got.idle_ttl_s, got.copy_every_s, got.hibernate_after_s) == (30.0, 2.0, 45.0)
    never = fleet_session_settings(build_parser().parse_args(["serve", "m", "--ray", "--session-idle-ttl", "0"]))
    assert never.idle_ttl_s is None
    assert fleet_session_settings(build_parser().parse_args(["serve", "m", "--ray"])).idle_ttl_s == DEFAULT_IDLE_TTL_S


def test_the_fleet_gets_the_servers_bounds_and_operators():
    """The per-tenant quotas, the waiting queue and the request bounds of one server reach every
    replica (a fleet used to queue a burst without bound and take any number of sessions), and
    ``--fleet-operator`` names who may change the fleet."""
    pytest.importorskip("ray")
    from execstate.fleet.ray_app.app import fleet_session_settings
    from execstate.serve.server import limits_from_args

    args = build_parser().parse_args(["serve", "m", "--ray", "--tenant-max-sessions", "3", "--max-waiting-requests",
                                      "48", "--fleet-operator", "ops", "--fleet-operator", "oncall"])
    got = fleet_session_settings(args)
    assert got.quotas.sessions == 3 and got.operators == ("ops", "oncall")
    assert limits_from_args(args).max_waiting_requests == 48
    assert fleet_session_settings(build_parser().parse_args(["serve", "m", "--ray"])).operators == ()
