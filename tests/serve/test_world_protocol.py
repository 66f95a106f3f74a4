"""The world connection's state machine and the message parser, without a model or a server
(the chunk-boundary event rules are the runtime's: tests/session/)."""

from __future__ import annotations

import pytest

from execstate.serve.world_protocol import SessionStart, WorldProtocolError, parse_client_message
from execstate.serve.world_state import Phase, WorldConnState


def code_of(fn) -> str:
    with pytest.raises(WorldProtocolError) as info:
        fn()
    return info.value.code


def test_state_machine():
    s = WorldConnState()
    assert code_of(lambda: s.check("key.down", 1)) == "no_session"
    s.check("session.ping")
    s.check("session.start")
    s.started("world-0")
    assert code_of(lambda: s.check("session.start")) == "session_exists"
    assert code_of(lambda: s.check("session.resume")) == "not_paused"
    s.check("key.down")
    s.paused()
    assert s.phase is Phase.PAUSED
    assert code_of(lambda: s.check("session.pause")) == "already_paused"
    s.check("key.up")  # events queue while paused
    s.resumed()
    s.done()
    assert s.phase is Phase.NO_SESSION and s.request_id is None
    s.gone()
    e = pytest.raises(WorldProtocolError, s.check, "session.ping", "x").value
    assert e.code == "connection_closed" and e.event_id == "x"


def test_parse():
    msg = parse_client_message('{"type": "session.start", "prompt": "a", "seed": 3, "fps": 0, "event_id": 9}')
    assert isinstance(msg, SessionStart) and msg.seed == 3 and msg.fps == 0 and msg.event_id == 9
    for frame, code, eid in [
        ("nope", "invalid_message", None),
        ("[1]", "invalid_message", None),
        ('{"type": "video.fly", "event_id": "a"}', "unknown_type", "a"),
        ('{"type": "key.down", "event_id": 4}', "invalid_message", 4),
        ('{"type": "key.down", "key": "up", "bogus": 1, "event_id": "b"}', "invalid_message", "b"),
        ('{"type": "session.start", "format": "gif", "event_id": 5}', "invalid_message", 5),
        ('{"type": "session.ping", "event_id": true}', "invalid_message", None),
        ('{"type": "session.start", "extra_params": [1], "event_id": 6}', "invalid_message", 6),
        ("{" + " " * (70 << 10) + "}", "message_too_large", None),
    ]:
        e = pytest.raises(WorldProtocolError, parse_client_message, frame).value
        assert (e.code, e.event_id) == (code, eid), frame[:60]
        assert e.message
