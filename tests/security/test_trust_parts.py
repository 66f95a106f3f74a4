"""The trust parts without a model: API keys to tenants on the wire, the migration allow-list, the
signed hand-over calls, and secret rotation for PD handoffs (docs/security.md)."""

from __future__ import annotations

import time

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from execstate.identity.secret_ring import SecretRing
from execstate.serve.auth import APIKeyMiddleware, scope_tenant
from execstate.serve.principals import KeyRing
from execstate.serve.sessions.handover_wire import (
    HandoverRequest,
    answer_signature,
    answer_verifies,
    open_request,
    seal_request,
)
from execstate.serve.sessions.targets import MigrationTargets
from execstate.session.runtime.migration import MigrationError
from execstate.transfer.handoff import Handoff, HandoffError, HandoffTrust

OLD, NEW = b"the-old-shared-secret-012345", b"the-new-shared-secret-012345"


def app(keys: KeyRing) -> TestClient:
    async def who(request: Request) -> JSONResponse:
        return JSONResponse({"tenant": scope_tenant(request.scope)})

    inner = Starlette(routes=[Route("/v1/who", who), Route("/v1/peer", who, methods=["POST"]), Route("/health", who)])
    return TestClient(APIKeyMiddleware(inner, keys=keys, peer_paths=["/v1/peer"]))


def test_each_key_is_its_tenant_and_a_wrong_key_is_refused(tmp_path):
    (tmp_path / "keys").write_text("key-of-team-a-1 team-a  # comment\nkey-of-team-b-1 team-b\n\n")
    c = app(KeyRing.build(["key-of-default-1"], tmp_path / "keys"))
    for key, tenant in (("key-of-team-a-1", "team-a"), ("key-of-team-b-1", "team-b"),
                        ("key-of-default-1", "default")):
        assert c.get("/v1/who", headers={"authorization": f"Bearer {key}"}).json() == {"tenant": tenant}
    for headers in ({}, {"authorization": "Bearer wrong-key-123"}, {"authorization": "key-of-team-a-1"}):
        r = c.get("/v1/who", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert c.post("/v1/peer").status_code == 200  # signed by the instances, checked by its route
    assert c.get("/v1/peer").status_code == 401  # only the POST of a peer path
    assert c.get("/health").status_code == 200


def test_an_open_server_has_one_local_tenant():
    c = app(KeyRing.build([]))
    assert c.get("/v1/who").json() == {"tenant": "local"}
    assert c.get("/v1/who", headers={"authorization": "Bearer anything-at-all"}).json() == {"tenant": "local"}


def test_the_allow_list_names_targets_by_url_or_engine_id():
    targets = MigrationTargets.parse(["http://10.0.0.1:8000, t-2=https://t2.example:443", "http://h:9"])
    assert targets.resolve("http://10.0.0.1:8000").engine_id is None
    assert targets.resolve("http://10.0.0.1:8000/").base == "http://10.0.0.1:8000"
    assert targets.resolve("t-2").base == "https://t2.example:443"
    assert targets.resolve("https://t2.example:443").engine_id == "t-2"
    for bad in ("http://10.0.0.2:8000", "t-3", "ftp://h:9", "http://h:9/v1/sessions/import", ""):
        with pytest.raises(MigrationError) as e:
            targets.resolve(bad)
        assert e.value.code == "target_not_allowed"
    with pytest.raises(MigrationError, match="migration is off"):
        MigrationTargets.parse(None).resolve("http://h:9")
    for bad in (["http://h:1/path"], ["bad id=http://h:1"], ["nothing"]):
        with pytest.raises(ValueError):
            MigrationTargets.parse(bad)


def test_hand_over_calls_are_signed_per_call_and_answers_per_outcome():
    ring = SecretRing(NEW)
    req = HandoverRequest("ab" * 16, "t-1", "s-1", time.time() + 30)
    body = seal_request("commit", req, ring)
    assert open_request("commit", body, ring) == req
    for call, secret in (("abort", ring), ("commit", SecretRing(OLD)), ("commit", None)):
        with pytest.raises(MigrationError) as e:  # another call's signature, another secret, no secret
            open_request(call, body, secret)
        assert e.value.code == "unauthorized"
    env = msgspec.msgpack.decode(body)
    forged = msgspec.msgpack.encode({"payload": msgspec.msgpack.encode(
        {"nonce": "cd" * 16, "target_engine_id": "t-1", "session_id": "s-1", "expires_at": 0.0}),
        "signature": env["signature"]})
    with pytest.raises(MigrationError):
        open_request("commit", forged, ring)
    sig = answer_signature(ring, "abort", req.nonce, "aborted")
    assert answer_verifies(ring, "abort", req.nonce, "aborted", sig)
    assert not answer_verifies(ring, "commit", req.nonce, "aborted", sig)
    assert not answer_verifies(ring, "abort", "ef" * 16, "aborted", sig)
    assert not answer_verifies(SecretRing(OLD), "abort", req.nonce, "aborted", sig)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_a_request_or_a_clear_refusal(data):
    try:
        open_request("abort", data, SecretRing(NEW))
    except MigrationError as e:
        assert e.code in ("invalid", "unauthorized")


def test_pd_handoffs_verify_under_the_previous_secret_during_a_rotation():
    h = Handoff("p-1", "tcp://127.0.0.1:5000", "tr-1", 0, 2, 16, int(time.time()) + 60)
    signed_old = h.to_params(SecretRing(OLD))
    rotating = HandoffTrust(SecretRing(NEW, (OLD,)))
    assert rotating.accept(signed_old) == h
    assert rotating.accept(h.to_params(SecretRing(NEW))) == h
    with pytest.raises(HandoffError):  # the rotation is over: the old secret is refused
        HandoffTrust(SecretRing(NEW)).accept(signed_old)
    assert HandoffTrust(SecretRing(OLD)).accept(signed_old) == h
