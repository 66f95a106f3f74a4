"""Who may use the fleet's operations (``/v1/fleet/...``) on a keyed fleet: any tenant's key lists
the replicas (401 without one), and only an operator tenant's (``--fleet-operator``) drains a
replica or rolls a weight update (403 for the others, before any replica is asked). Built on a
real ``FleetIngress`` app with a stand-in for the engine deployment's handle; the Ray end to end
is the fleet soak (``execstate bench soak --ray``, tests/bench/test_soak_ray.py, slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent))

from fastapi.testclient import TestClient  # noqa: E402
from ingress_helpers import NoReplicaAsked, ingress_model  # noqa: E402

from execstate.fleet.ray_app import fleet_ops  # noqa: E402
from execstate.fleet.ray_app.ingress import FleetIngress  # noqa: E402
from execstate.fleet.ray_app.session_settings import SessionSettings  # noqa: E402

OPS_KEY, USER_KEY = "sk-operator-0001", "sk-user-00000002"
REPLICA = "SERVE_REPLICA::execstate#EngineReplica#aaa"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return ingress_model(tmp_path_factory.mktemp("fleet_ops_keys"))


def _client(model_dir: Path, tmp_path: Path, operators: tuple[str, ...], monkeypatch) -> TestClient:
    monkeypatch.setattr(fleet_ops, "actor_alive", lambda rid: True)
    keys = tmp_path / "keys"
    keys.write_text(f"{OPS_KEY} ops\n{USER_KEY} tenant-a\n")
    ingress = FleetIngress(NoReplicaAsked(), str(model_dir),
                           SessionSettings(api_keys_file=str(keys), operators=operators))
    ingress.replicas[REPLICA] = {"replica_id": REPLICA, "role": "engine", "weights_version": "v0"}
    return TestClient(ingress.__serve_build_asgi_app__())


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_listing_the_replicas_needs_a_key(model_dir, tmp_path, monkeypatch) -> None:
    client = _client(model_dir, tmp_path, ("ops",), monkeypatch)
    for headers in ({}, _auth("sk-wrong-key-0003")):
        r = client.get("/v1/fleet/replicas", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert REPLICA not in r.text
    listed = client.get("/v1/fleet/replicas", headers=_auth(USER_KEY))
    assert listed.status_code == 200
    assert [x["replica_id"] for x in listed.json()["replicas"]] == [REPLICA]


@pytest.mark.parametrize("operators", [("ops",), ()])
def test_only_an_operator_changes_the_fleet(model_dir, tmp_path, monkeypatch, operators) -> None:
    client = _client(model_dir, tmp_path, operators, monkeypatch)
    calls = [("/v1/fleet/drain", {"replica": REPLICA}),
             ("/v1/fleet/update_weights", {"source": str(model_dir), "weights_version": "v1"})]
    for path, body in calls:
        assert client.post(path, json=body).status_code == 401
        refused = client.post(path, json=body, headers=_auth(USER_KEY))
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "unauthorized" and "--fleet-operator" in refused.text
        if not operators:  # no operator named: not even the would-be operator's key changes the fleet
            assert client.post(path, json=body, headers=_auth(OPS_KEY)).status_code == 403
    # the operator's key passes the check (a bad body shows it reached the operation itself)
    if operators:
        bad = client.post("/v1/fleet/update_weights", content=b"{}", headers=_auth(OPS_KEY))
        assert bad.status_code == 400 and "weights_version" in bad.text
    assert json.loads(client.get("/v1/fleet/replicas", headers=_auth(OPS_KEY)).text)["replicas"][0]["weights_version"] \
        == "v0"
