"""The realtime phase machine with each protocol's table, without a model or a server.

For every protocol (``/v1/realtime``, ``/v1/realtime/agent``, ``/v1/realtime/video``), every
message type in every phase gets the refusal its rule table (docs/realtime.md,
docs/agent-protocol.md, docs/world-serving.md, written out again here independently) says, and
random sequences of moves keep the machine's invariants."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.serve.realtime.agent import messages as agent
from execstate.serve.realtime.errors import ProtocolError
from execstate.serve.realtime.lm import messages as lm
from execstate.serve.realtime.phases import GONE, Move, Phase, PhaseMachine, PhaseTable, Refusal
from execstate.serve.realtime.protocol import RealtimeProtocol
from execstate.serve.realtime.world import messages as world

LM_OPENING = {"session.create", "session.resume"}
LM_MID_STEP = {"event.submit", "response.cancel", "session.get", "session.close"}


def lm_expected(phase: str, kind: str) -> str | None:
    if phase == "gone":
        return "connection_closed"
    if phase == "no_session":
        return None if kind in LM_OPENING else "no_session"
    if kind in LM_OPENING:
        return "session_exists"
    if phase == "responding":
        return None if kind in LM_MID_STEP else "response_in_progress"
    return "no_response" if kind == "response.cancel" else None


def agent_expected(phase: str, kind: str) -> str | None:
    if phase == "gone":
        return "connection_closed"
    if phase == "no_session":
        return None if kind == "session.create" else "no_session"
    if kind == "session.create":
        return "session_exists"
    if phase == "ended":
        return None if kind == "session.close" else "session_ended"
    return None


def world_expected(phase: str, kind: str) -> str | None:
    if phase == "gone":
        return "connection_closed"
    if kind == "session.ping":
        return None
    if phase == "no_session":
        return None if kind == "session.create" else "no_session"
    if kind == "session.create":
        return "session_exists"
    if phase == "running" and kind == "session.unpause":
        return "not_paused"
    if phase == "paused" and kind == "session.pause":
        return "already_paused"
    return None


@dataclass(frozen=True)
class Case:
    protocol: RealtimeProtocol
    expected: Callable[[str, str], str | None]
    sets: dict[str, dict[str, Any]]  # move name -> the values its handler sets
    subject: str  # the value that is None exactly in the start phase


CASES = {
    "lm": Case(lm.LM_PROTOCOL, lm_expected, {"attach": {"session_id": "s1"}, "begin_response": {"response_id": "r1"},
                                             "end_response": {"response_id": None}}, "session_id"),
    "agent": Case(agent.AGENT_PROTOCOL, agent_expected, {"open": {"session_id": "sess-1"}}, "session_id"),
    "world": Case(world.WORLD_PROTOCOL, world_expected, {"start": {"request_id": "world-0"}}, "request_id"),
}
PHASE_CASES = [(name, phase) for name, c in CASES.items() for phase in (*c.protocol.phases.phases, GONE)]


def refusal(state: PhaseMachine, kind: str) -> str | None:
    try:
        state.check(kind, "e1")
    except ProtocolError as e:
        assert e.event_id == "e1" and e.message and e.kind == "invalid_request_error"
        return e.code
    return None


def machine_in(case: Case, phase: Phase) -> PhaseMachine:
    """A machine brought to ``phase`` by the shortest sequence of the table's moves (or ``gone()``)."""
    table = case.protocol.phases
    paths: dict[Phase, list[Move]] = {table.start: []}
    queue = [table.start]
    while queue:
        here = queue.pop(0)
        for move in table.moves:
            if (move.sources is None or here in move.sources) and move.target not in paths:
                paths[move.target] = [*paths[here], move]
                queue.append(move.target)
    m = PhaseMachine(table)
    for move in paths.get(phase, []):
        m.move(move, **case.sets.get(move.name, {}))
    if phase is GONE:
        m.gone()
    return m


@pytest.mark.parametrize(("name", "phase"), PHASE_CASES, ids=[f"{n}-{p.name}" for n, p in PHASE_CASES])
def test_every_message_in_every_phase(name, phase):
    case = CASES[name]
    m = machine_in(case, phase)
    assert m.phase is phase
    for kind in case.protocol.messages.types:
        assert refusal(m, kind) == case.expected(phase.name, kind), kind


@pytest.mark.parametrize("name", list(CASES))
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_transitions_keep_the_invariants(name, data):
    case = CASES[name]
    table = case.protocol.phases
    m = PhaseMachine(table)
    ops = data.draw(st.lists(st.sampled_from([*table.moves, "gone"]), max_size=30))
    for op in ops:
        before, values = m.phase, dict(m.values)
        if op == "gone":
            m.gone()
            assert m.phase is GONE
        else:
            try:
                m.move(op, **case.sets.get(op.name, {}))
            except RuntimeError:
                assert op.strict and before is not GONE and before not in op.sources
                assert (m.phase, m.values) == (before, values)  # a refused move changes nothing
            if before is GONE or (op.sources is not None and before not in op.sources):
                assert (m.phase, m.values) == (before, values)  # from elsewhere: nothing moves
            else:
                assert m.phase is op.target
        if before is GONE:
            assert m.phase is GONE  # nothing leaves GONE
        if m.phase is not GONE:
            assert (m.values[case.subject] is None) == (m.phase is table.start)
        for kind in case.protocol.messages.types:
            assert refusal(m, kind) == case.expected(m.phase.name, kind)


def test_lm_refusals_name_the_session_and_the_response():
    m = PhaseMachine(lm.PHASES)
    m.move(lm.ATTACH, session_id="s1")
    m.move(lm.BEGIN_RESPONSE, response_id="resp-1")
    e = pytest.raises(ProtocolError, m.check, "session.fork", 3).value
    assert (e.code, e.event_id, e.message) == ("response_in_progress", 3, "session.fork: response 'resp-1' is in "
                                               "progress; wait for its response.done or send response.cancel")
    e = pytest.raises(ProtocolError, m.check, "session.resume").value
    assert e.message == "session.resume: this connection already has session 's1'; send session.close first"
    m.move(lm.END_RESPONSE, response_id=None)
    m.move(lm.DETACH)
    assert m.phase is lm.NO_SESSION and m.values == {"session_id": None, "response_id": None}


def test_agent_sequence():
    s = PhaseMachine(agent.PHASES)
    for kind in ("input_text.append", "session.close", "response.cancel"):
        with pytest.raises(ProtocolError) as e:
            s.check(kind, "x")
        assert (e.value.code, e.value.event_id) == ("no_session", "x")
    s.check("session.create")
    s.move(agent.OPEN, session_id="sess-1")
    with pytest.raises(ProtocolError) as e:
        s.check("session.create", 1)
    assert e.value.code == "session_exists" and "sess-1" in e.value.message
    s.check("input_text.append")
    with pytest.raises(RuntimeError):
        s.move(agent.OPEN, session_id="again")  # a strict move from a phase it does not start from
    s.move(agent.END)
    with pytest.raises(ProtocolError) as e:
        s.check("input_text.append")
    assert e.value.code == "session_ended"
    s.check("session.close")
    s.move(agent.CLOSE)
    assert s.phase is agent.NO_SESSION and s.values["session_id"] is None
    s.gone()
    with pytest.raises(ProtocolError) as e:
        s.check("session.create")
    assert e.value.code == "connection_closed"
    s.move(agent.OPEN, session_id="again")  # the connection is closing: nothing leaves GONE
    assert s.phase is GONE


def test_world_sequence():
    s = PhaseMachine(world.PHASES)
    assert pytest.raises(ProtocolError, s.check, "key.down", 1).value.code == "no_session"
    s.check("session.ping")
    s.check("session.create")
    s.move(world.START, request_id="world-0")
    e = pytest.raises(ProtocolError, s.check, "session.create").value
    assert e.code == "session_exists" and e.message == ("session world-0 is running on this connection; send "
                                                        "session.close first")
    assert pytest.raises(ProtocolError, s.check, "session.unpause").value.code == "not_paused"
    s.check("key.down")
    s.move(world.PAUSE)
    assert s.phase is world.PAUSED
    assert pytest.raises(ProtocolError, s.check, "session.pause").value.code == "already_paused"
    s.check("key.up")  # events queue while paused
    s.move(world.UNPAUSE)
    s.move(world.CLOSE)
    assert s.phase is world.NO_SESSION and s.values["request_id"] is None
    s.gone()
    e = pytest.raises(ProtocolError, s.check, "session.ping", "x").value
    assert e.code == "connection_closed" and e.event_id == "x"


def test_tables_are_checked_when_written():
    a = Phase("a", allow=frozenset({"x"}), otherwise=Refusal("no", "{type} needs {who}"))
    with pytest.raises(ValueError, match="who"):
        PhaseTable(a, (a,), ())
    b = Phase("b")
    with pytest.raises(ValueError, match="leaves"):
        PhaseTable(b, (b,), (Move("to_a", None, a),))
    with pytest.raises(ValueError, match="otherwise"):
        Phase("c", allow=frozenset())
    with pytest.raises(ValueError, match="start"):
        PhaseTable(b, (a, b), ())
    m = PhaseMachine(PhaseTable(b, (b,), (), values=("who",)))
    with pytest.raises(ValueError, match="not in this connection's table"):
        m.move(lm.ATTACH, session_id="s")
