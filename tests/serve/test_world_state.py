"""The world connection's state machine, the chunk-boundary event rules and the message parser,
without a model or a server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.serve.world_events import BoundaryEvents
from execstate.serve.world_protocol import SessionStart, WorldProtocolError, parse_client_message
from execstate.serve.world_state import Phase, WorldConnState

KEYS = ("none", "up", "down", "left", "right")


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
        ("{" + " " * (70 << 10) + "}", "message_too_large", None),
    ]:
        e = pytest.raises(WorldProtocolError, parse_client_message, frame).value
        assert (e.code, e.event_id) == (code, eid), frame[:60]
        assert e.message


def test_held_key_is_one_event_until_released():
    ev = BoundaryEvents(KEYS)
    ev.key_down("a", "right")
    b = ev.boundary()
    assert (KEYS[b.key], b.started, b.active, b.completed) == ("right", ("a",), ("a",), ())
    b = ev.boundary()
    assert (KEYS[b.key], b.started, b.active, b.completed) == ("right", (), ("a",), ())
    ev.key_down("b", "up")  # the key pressed last wins while both are held
    b = ev.boundary()
    assert (KEYS[b.key], b.started, b.active) == ("up", ("b",), ("a", "b"))
    assert ev.key_up("c", "up") == "b"
    b = ev.boundary()
    assert (KEYS[b.key], b.completed, b.active) == ("right", ("b",), ("a",))
    ev.key_up("d", "right")
    b = ev.boundary()
    assert (KEYS[b.key], b.completed, b.active) == ("none", ("a",), ())


def test_tap_acts_for_one_chunk_and_prompt_last_wins():
    ev = BoundaryEvents(KEYS)
    ev.key_down("t", "left")
    ev.key_up("t-up", "left")
    ev.interaction("p1", prompt="a snow maze")
    ev.interaction("p2", prompt="a lava maze")
    b = ev.boundary()
    assert KEYS[b.key] == "left" and b.prompt == "a lava maze"
    assert b.started == ("t", "p1", "p2") and set(b.completed) == {"t", "p1", "p2"} and "t" in b.active
    b = ev.boundary()
    assert (KEYS[b.key], b.prompt, b.started, b.active, b.completed) == ("none", None, (), (), ())


def test_action_interaction_replaces_held_keys():
    ev = BoundaryEvents(KEYS)
    ev.key_down("a", "up")
    ev.boundary()
    ev.interaction("act", keys=["down"], prompt="a night maze")
    b = ev.boundary()
    assert KEYS[b.key] == "down" and b.prompt == "a night maze"
    assert b.completed == ("a",) and b.started == ("act",) and b.active == ("act",)
    ev.key_up("u", "down")
    b = ev.boundary()
    assert b.completed == ("act",) and KEYS[b.key] == "none"


def test_out_of_order_events_are_refused_before_anything_changes():
    ev = BoundaryEvents(KEYS, max_pending=3)
    assert code_of(lambda: ev.key_up("x", "up")) == "key_not_held"
    assert code_of(lambda: ev.key_down("x", "jump")) == "unknown_key"
    assert code_of(lambda: ev.key_down("x", "none")) == "unknown_key"
    ev.key_down("a", "up")
    assert code_of(lambda: ev.key_down("b", "up")) == "key_already_held"
    assert code_of(lambda: ev.interaction("a", prompt="again")) == "event_id_conflict"
    ev.interaction("p", prompt="x")
    ev.interaction("q", prompt="y")
    assert code_of(lambda: ev.interaction("r", prompt="z")) == "backpressure"
    assert code_of(lambda: ev.interaction("s")) == "invalid_message"
    assert ev.num_pending == 3
    b = ev.boundary()
    assert b.started == ("a", "p", "q") and b.prompt == "y"


OPS = st.lists(st.tuples(st.sampled_from(["down", "up", "prompt", "action", "boundary"]),
                         st.sampled_from(list(KEYS) + ["jump"]), st.integers(0, 30)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_events_against_an_oracle(ops):
    """Any sequence: refusals are WorldProtocolErrors with a code; accepted ones match a simple
    model of which keys are held; every started event completes exactly once at most."""
    ev = BoundaryEvents(KEYS)
    held: dict[str, str] = {}  # the oracle: key -> event id after every accepted event
    started, completed = [], []
    for op, key, n in ops:
        eid = f"e{n}"
        try:
            if op == "down":
                ev.key_down(eid, key)
                held[key] = eid
            elif op == "up":
                ev.key_up(eid, key)
                del held[key]
            elif op == "prompt":
                ev.interaction(eid, prompt=f"p{n}")
            elif op == "action":
                ev.interaction(eid, keys=[key])
                held = {key: eid}
            else:
                b = ev.boundary()
                started.extend(b.started)
                completed.extend(b.completed)
                assert set(held.values()) <= set(b.active)
                if held:  # the key pressed last among the held ones (a tap only acts when none is held)
                    assert KEYS[b.key] == next(reversed(held))
        except WorldProtocolError as e:
            assert e.code in {"unknown_key", "key_already_held", "key_not_held", "event_id_conflict",
                              "backpressure", "invalid_message"} and e.message
    assert len(completed) == len(set(completed))
    assert set(completed) <= set(started)
