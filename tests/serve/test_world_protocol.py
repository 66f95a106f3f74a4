"""The world protocol's message parser, without a model or a server (the connection's phases:
test_realtime_phases.py; the chunk-boundary event rules are the runtime's: tests/session/)."""

from __future__ import annotations

import pytest

from execstate.serve.realtime.errors import ProtocolError
from execstate.serve.realtime.world.messages import WORLD_PROTOCOL, SessionCreate

parse_client_message = WORLD_PROTOCOL.parse


def test_parse():
    msg = parse_client_message('{"type": "session.create", "prompt": "a", "seed": 3, "fps": 0, "event_id": 9}')
    assert isinstance(msg, SessionCreate) and msg.seed == 3 and msg.fps == 0 and msg.event_id == 9
    for frame, code, eid in [
        ("nope", "invalid_message", None),
        ("[1]", "invalid_message", None),
        ('{"type": "video.fly", "event_id": "a"}', "unknown_type", "a"),
        ('{"type": "key.down", "event_id": 4}', "invalid_message", 4),
        ('{"type": "key.down", "key": "up", "bogus": 1, "event_id": "b"}', "invalid_message", "b"),
        ('{"type": "session.create", "format": "gif", "event_id": 5}', "invalid_message", 5),
        ('{"type": "session.ping", "event_id": true}', "invalid_message", None),
        ('{"type": "session.create", "extra_params": [1], "event_id": 6}', "invalid_message", 6),
        ("{" + " " * (70 << 10) + "}", "message_too_large", None),
    ]:
        e = pytest.raises(ProtocolError, parse_client_message, frame).value
        assert (e.code, e.event_id) == (code, eid), frame[:60]
        assert e.message
