"""Which replica a realtime socket of the fleet goes to, and what the ingress reads of its frames
(``fleet/ray_app/ws_route.py``: pure, no Ray, no network)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from execstate.fleet.ray_app.prompt_route import SessionReplicas
from execstate.fleet.ray_app.ws_route import (
    CLOSE_REPLICA_LOST,
    WS_PATHS,
    SessionChange,
    accepted_subprotocol,
    clip_reason,
    first_frame_route,
    forwarded_headers,
    lost_reason,
    needs_first_frame,
    sendable_close_code,
    session_change,
    ws_credential,
)
from execstate.fleet.router.policy import RouteRequest
from execstate.serve.realtime.agent.endpoint import PATH as AGENT_PATH
from execstate.serve.realtime.lm.endpoint import PATH as LM_PATH
from execstate.serve.realtime.voice.handlers import PATH as VOICE_PATH

RID = "SERVE_REPLICA::execstate#EngineReplica#abc123"


def test_the_paths_are_the_replica_apps_sockets():
    assert WS_PATHS == (LM_PATH, AGENT_PATH, VOICE_PATH)
    assert [needs_first_frame(p) for p in WS_PATHS] == [True, False, False]


def test_a_resume_of_a_known_session_goes_to_its_replica():
    owners = SessionReplicas()
    owners.set("caller-a", "s1", RID)
    resume = json.dumps({"type": "session.resume", "session_id": "s1", "event_id": "x"})
    assert first_frame_route(resume, "caller-a", owners) == RouteRequest(session_replica=RID)
    # another caller's session of the same id is not this caller's: placed by the router
    assert first_frame_route(resume, "caller-b", owners) == RouteRequest()
    unknown = json.dumps({"type": "session.resume", "session_id": "nope"})
    assert first_frame_route(unknown, "caller-a", owners) == RouteRequest()
    for other in (json.dumps({"type": "session.create", "session": {"id": "s1"}}), '{"type": "session.resume"',
                  json.dumps({"type": "session.resume", "session_id": 7}), json.dumps(["session.resume"]), b"\x00",
                  None, json.dumps({"type": "session.get", "note": "session.resume"})):
        assert first_frame_route(other, "caller-a", owners) == RouteRequest(), other


def event(kind: str, **fields) -> str:
    """A server event as the replica's realtime framework encodes it (msgspec: compact, type first)."""
    return json.dumps({"type": kind, "event_id": None, **fields}, separators=(",", ":"))


def test_the_sessions_a_replica_opens_and_closes_are_read_from_its_events():
    for kind in ("session.created", "session.resumed", "session.forked"):
        assert session_change(event(kind, session={"session_id": "s9", "status": "open"})) == SessionChange("s9", True)
    assert session_change(event("session.closed", session_id="s9")) == SessionChange("s9", False)
    delta = event("response.delta", response_id="r", token_ids=[1, 2], text="session.created")
    assert session_change(delta) is None
    assert session_change(event("session.info", session={"session_id": "s9"})) is None
    assert session_change(event("session.created", session={"id": "s9"})) is None
    assert session_change('{"type":"session.created", broken') is None


@given(st.text(max_size=200))
def test_session_change_never_raises_on_any_frame(frame):
    change = session_change(frame)
    assert change is None or isinstance(change.session_id, str)


def test_the_credential_is_the_header_else_the_browser_subprotocol_key():
    assert ws_credential("Bearer sk-1", ["openai-insecure-api-key.sk-2"]) == "Bearer sk-1"
    assert ws_credential(None, ["realtime", "openai-insecure-api-key.sk-2"]) == "Bearer sk-2"
    assert ws_credential(None, ["realtime", "openai-insecure-api-key."]) is None
    assert ws_credential(None, []) is None
    assert accepted_subprotocol(["openai-insecure-api-key.k", "realtime"]) == "realtime"
    assert accepted_subprotocol(["openai-insecure-api-key.k"]) is None


def test_handshake_headers_are_not_forwarded_the_rest_is():
    headers = [("host", "x"), ("Authorization", "Bearer k"), ("sec-websocket-key", "abc"), ("upgrade", "websocket"),
               ("connection", "Upgrade"), ("sec-websocket-protocol", "realtime"), ("openai-beta", "realtime=v1"),
               ("sec-websocket-version", "13")]
    assert forwarded_headers(headers) == [("Authorization", "Bearer k"), ("openai-beta", "realtime=v1")]


SENDABLE = {1000, 1001, 1002, 1003, *range(1007, 1015), *range(3000, 5000)}


@given(st.one_of(st.none(), st.integers(-10, 70000)))
def test_a_close_code_is_passed_on_only_when_a_close_frame_may_carry_it(code):
    out = sendable_close_code(code)
    assert out in SENDABLE
    assert out == (code if code in SENDABLE else 1000)


@given(st.text())
def test_a_reason_fits_a_close_frame(reason):
    clipped = clip_reason(reason)
    assert len(clipped.encode()) <= 123 and reason.startswith(clipped)
    if len(reason.encode()) <= 123:
        assert clipped == reason


def test_a_lost_replica_is_named_in_the_reason():
    assert CLOSE_REPLICA_LOST == 1014
    assert RID in lost_reason(RID) and len(lost_reason(RID).encode()) <= 123
