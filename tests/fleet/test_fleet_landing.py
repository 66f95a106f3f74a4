"""The fleet's landing page at ``GET /``: answered by the ingress itself (no replica is asked), the
single server's page with the fleet's rows: the model, the fleet's shape from the replicas that
registered, each replica (role, weights version, draining), the endpoints. On a keyed fleet the page
(public: a browser cannot send a key) names neither the model nor a replica. Built on a real
``FleetIngress`` app with a stand-in for the engine deployment's handle; the Ray end to end is in
test_ray_fleet.py (slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent))

from fastapi.testclient import TestClient  # noqa: E402
from ingress_helpers import NoReplicaAsked, ingress_model  # noqa: E402

from execstate.fleet.ray_app.ingress import FleetIngress  # noqa: E402
from execstate.fleet.ray_app.landing import fleet_shape  # noqa: E402
from execstate.fleet.ray_app.session_settings import SessionSettings  # noqa: E402

REPLICAS = {
    "SERVE_REPLICA::execstate#EngineReplica#aaa": {"role": "engine", "weights_version": "0123456789abcdef0123"},
    "SERVE_REPLICA::execstate#EngineReplica#bbb": {"role": "engine", "weights_version": "0123456789abcdef0123"},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return ingress_model(tmp_path_factory.mktemp("fleet_landing_moe"))


def _page(model_dir: Path, replicas: dict, draining: set[str] = frozenset(), keys_file: Path | None = None) -> str:
    ingress = FleetIngress(NoReplicaAsked(), str(model_dir),
                           SessionSettings(api_keys_file=str(keys_file) if keys_file else None))
    ingress.replicas.update(replicas)
    ingress.draining.update(draining)
    r = TestClient(ingress.__serve_build_asgi_app__()).get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    return r.text


def test_the_fleet_page_lists_its_model_replicas_and_endpoints(model_dir) -> None:
    page = _page(model_dir, REPLICAS, {"SERVE_REPLICA::execstate#EngineReplica#bbb"})
    assert str(model_dir) in page and "2 engine replicas, on Ray Serve" in page
    row = "<th>replica SERVE_REPLICA::execstate#EngineReplica#{}</th><td>engine, weights 0123456789abcdef{}</td>"
    assert row.format("aaa", "") in page and row.format("bbb", ", draining") in page
    for endpoint in ("POST /v1/completions, /v1/chat/completions", '<a href="/v1/fleet/replicas">', "/v1/sessions",
                     "WS /v1/realtime", "WS /v1/realtime/agent", "WS /v1/voice/realtime",
                     "POST /v1/fleet/drain, /v1/fleet/update_weights"):
        assert endpoint in page, endpoint


def test_a_keyed_fleet_page_names_no_model_and_no_replica(model_dir, tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-alpha tenant-a\n")
    page = _page(model_dir, REPLICAS, keys_file=keys)
    assert str(model_dir) not in page and "SERVE_REPLICA" not in page and "0123456789" not in page
    assert "2 engine replicas, on Ray Serve" in page and "GET /v1/models with" in page
    assert "sk-alpha" not in page and "tenant-a" not in page


def test_the_page_before_any_replica_registered(model_dir) -> None:
    assert "no replica registered yet" in _page(model_dir, {})


def test_the_fleet_shape_counts_roles() -> None:
    pd = {"p1": {"role": "prefill"}, "d1": {"role": "decode"}, "d2": {"role": "decode"}}
    assert fleet_shape(pd) == "1 prefill and 2 decode replicas, on Ray Serve"
    assert fleet_shape({"e": {"role": "engine"}}) == "1 engine replica, on Ray Serve"


def test_the_ingress_routes_a_chat_by_the_replicas_chat_template(model_dir) -> None:
    """With ``--chat-template`` the ingress keys a chat prompt by the tokens the replicas compute."""
    import json

    from execstate.engine.tokenizer import Tokenizer
    from execstate.fleet.ray_app.prompt_route import prompt_route

    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there"}]}).encode()
    ingress = FleetIngress(NoReplicaAsked(), str(model_dir), chat_template=template)
    route = prompt_route("POST", "/v1/chat/completions", body, ingress.tokenizer)
    assert list(route.token_ids) == Tokenizer(model_dir).encode("[user] hello there\n", add_special_tokens=False)
    own = prompt_route("POST", "/v1/chat/completions", body, FleetIngress(NoReplicaAsked(), str(model_dir)).tokenizer)
    assert own.token_ids != route.token_ids
