"""fleet_app's placement and address options reach the engine deployment (no cluster needed; the
two-node test, tests/fleet/test_ray_netns.py, runs them on two Ray nodes)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from execstate.fleet.ray_app.app import NODE_IP, fleet_app  # noqa: E402
from execstate.fleet.ray_app.engine_replica import resolve_host  # noqa: E402


def engine_deployment(app):
    engines = app._bound_deployment.init_args[0]  # the ingress is bound to the engines' application
    return engines._bound_deployment


def test_replica_host_and_resources_reach_every_engine_replica():
    d = engine_deployment(fleet_app("m", 3, replica_host=NODE_IP, replica_resources={"execstate_engine": 1},
                                    replica_cpus=0.5, secret="s" * 64))
    assert d.num_replicas == 3
    assert d.ray_actor_options["resources"] == {"execstate_engine": 1}
    assert d.ray_actor_options["num_cpus"] == 0.5
    assert d.init_args[3] == NODE_IP == "node"
    default = engine_deployment(fleet_app("m", 2, secret="s" * 64))
    assert default.init_args[3] == "127.0.0.1" and "resources" not in default.ray_actor_options
    with pytest.raises(ValueError, match="replica_host"):
        fleet_app("m", 2, replica_host="")


def test_a_literal_replica_host_is_used_as_given():
    assert resolve_host("127.0.0.1") == "127.0.0.1"
    assert resolve_host("10.0.0.7") == "10.0.0.7"


def test_a_chat_template_reaches_the_replicas_and_the_ingress():
    """``--chat-template``: every replica renders chats with it, and the ingress routes a chat by the
    tokens it gives (the same template)."""
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    for pd in (None, (1, 1)):
        app = fleet_app("m", 2, engine_kwargs={"chat_template": template}, secret="s" * 64, pd=pd)
        assert app._bound_deployment.init_kwargs["chat_template"] == template
        for engines in app._bound_deployment.init_args[:2 if pd else 1]:
            assert engines._bound_deployment.init_args[2]["chat_template"] == template
    assert fleet_app("m", 2, secret="s" * 64)._bound_deployment.init_kwargs["chat_template"] is None
