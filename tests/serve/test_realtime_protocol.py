"""The realtime protocol's frames without a server: every frame is a typed message or a
ProtocolError with a code (and the frame's event_id when readable), never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.serve.realtime.errors import ProtocolError, error_event
from execstate.serve.realtime.limits import MAX_MESSAGE_BYTES
from execstate.serve.realtime.lm.messages import (
    LM_PROTOCOL,
    CheckpointRelease,
    EventSubmit,
    ResponseCreate,
    SessionCreate,
    SessionRollback,
)
from execstate.serve.realtime.messages import type_of

CLIENT_TYPES = LM_PROTOCOL.messages.types
parse_client_message = LM_PROTOCOL.parse


def test_every_client_type_parses():
    assert set(CLIENT_TYPES) == {"session.create", "session.resume", "event.submit", "response.create",
                                 "response.cancel", "session.checkpoint", "session.rollback", "session.fork",
                                 "session.close", "session.get", "session.reset", "checkpoint.release"}
    m = parse_client_message('{"type": "session.create", "event_id": "c1", "session": {"id": "s", '
                             '"sampling": {"temperature": 0.5}, "max_tokens": 4, "return_routes": true}}')
    assert isinstance(m, SessionCreate) and m.event_id == "c1"
    assert (m.session.id, m.session.sampling, m.session.max_tokens, m.session.return_routes) == (
        "s",
        {"temperature": 0.5},
        4,
        True,
    )
    m = parse_client_message(b'{"type": "event.submit", "event_id": 7, "kind": "input", "data": {"token_ids": [1, 2]}}')
    assert m == EventSubmit(event_id=7, kind="input", data={"token_ids": [1, 2]})
    m = parse_client_message('{"type": "response.create", "input": {"text": "hi"}, "max_tokens": 3}')
    assert isinstance(m, ResponseCreate) and m.input == {"text": "hi"} and m.max_tokens == 3
    assert parse_client_message('{"type": "session.rollback", "checkpoint_id": "cp-1"}') == SessionRollback("cp-1")
    m = parse_client_message('{"type": "session.create", "session": {"priority": 0, "cache_salt": "t1"}}')
    assert (m.session.priority, m.session.cache_salt) == (0, "t1")
    m = parse_client_message('{"type": "response.create", "reprefill": true, "return_routes": false}')
    assert (m.reprefill, m.return_routes) == (True, False)
    assert parse_client_message('{"type": "checkpoint.release", "checkpoint_id": "cp-2", "event_id": 1}') == \
        CheckpointRelease("cp-2", 1)
    assert type_of(parse_client_message('{"type": "session.reset"}')) == "session.reset"
    assert type_of(parse_client_message('{"type": "session.get", "event_id": "g"}')) == "session.get"


@pytest.mark.parametrize(
    ("frame", "code", "event_id"),
    [
        ("not json", "invalid_message", None),
        ("[1, 2]", "invalid_message", None),
        ('{"event_id": 3}', "unknown_type", 3),
        ('{"type": "session.explode", "event_id": "x"}', "unknown_type", "x"),
        ('{"type": "event.submit", "kind": "input"}', "invalid_message", None),  # event_id required
        ('{"type": "event.submit", "event_id": "7", "kind": "input"}', "invalid_message", "7"),
        ('{"type": "session.rollback", "event_id": 5}', "invalid_message", 5),  # checkpoint_id missing
        ('{"type": "response.create", "event_id": 9, "maxtokens": 3}', "invalid_message", 9),  # typo: not ignored
        ('{"type": "response.create", "event_id": true}', "invalid_message", None),
        ('{"type": "checkpoint.release", "event_id": "r"}', "invalid_message", "r"),  # checkpoint_id missing
        ('{"type": "session.create", "event_id": 4, "session": {"priority": "high"}}', "invalid_message", 4),
    ],
)
def test_malformed_frames_are_errors_with_a_code(frame, code, event_id):
    with pytest.raises(ProtocolError) as info:
        parse_client_message(frame)
    assert (info.value.code, info.value.event_id) == (code, event_id)
    assert info.value.message


def test_oversized_frame():
    with pytest.raises(ProtocolError) as info:
        parse_client_message('{"type": "session.close", "pad": "' + "x" * MAX_MESSAGE_BYTES + '"}')
    assert info.value.code == "message_too_large"


def test_error_event_shape():
    assert error_event("stale", "event_id 3 is not above 5", 3, param="event_id") == {
        "type": "error", "event_id": 3,
        "error": {"type": "invalid_request_error", "code": "stale", "message": "event_id 3 is not above 5",
                  "param": "event_id"}}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
frames = st.one_of(
    st.binary(max_size=64),
    json_values.map(json.dumps),
    st.fixed_dictionaries({"type": st.sampled_from([*CLIENT_TYPES, "x"])}, optional={
        "event_id": json_values, "kind": json_values, "data": json_values, "input": json_values,
        "max_tokens": json_values, "checkpoint_id": json_values, "session": json_values,
        "session_id": json_values, "junk": json_values}).map(json.dumps),
)


@settings(max_examples=400, deadline=None)
@given(frames)
def test_any_frame_is_a_message_or_a_protocol_error(frame):
    try:
        msg = parse_client_message(frame)
    except ProtocolError as e:
        assert e.code in ("invalid_message", "unknown_type", "message_too_large") and e.message
        assert e.event_id is None or isinstance(e.event_id, int | str)
        return
    assert type(msg).__struct_config__.tag in CLIENT_TYPES
