"""The realtime connection's state machine and the session owners, without a model or a server."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.cli import build_parser
from execstate.serve.realtime_protocol import CLIENT_TYPES, ProtocolError
from execstate.serve.realtime_registry import SessionOwners
from execstate.serve.realtime_state import ConnectionState, Phase

ACK_ONLY = {"session.create", "session.resume"}
MID_STEP = {"event.submit", "response.cancel", "session.get", "session.close"}


def refusal(state: ConnectionState, kind: str) -> str | None:
    try:
        state.check(kind, "e1")
    except ProtocolError as e:
        assert e.event_id == "e1" and e.message
        return e.code
    return None


def expected(phase: Phase, kind: str) -> str | None:
    """The rule table of docs/realtime.md, written out independently."""
    if phase is Phase.GONE:
        return "connection_closed"
    if phase is Phase.NO_SESSION:
        return None if kind in ACK_ONLY else "no_session"
    if kind in ACK_ONLY:
        return "session_exists"
    if phase is Phase.RESPONDING:
        return None if kind in MID_STEP else "response_in_progress"
    return "no_response" if kind == "response.cancel" else None


def state_in(phase: Phase) -> ConnectionState:
    s = ConnectionState()
    if phase in (Phase.READY, Phase.RESPONDING):
        s.attach("s1", False)
    if phase is Phase.RESPONDING:
        s.begin_response("resp-1")
    if phase is Phase.GONE:
        s.gone()
    assert s.phase is phase
    return s


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("kind", CLIENT_TYPES)
def test_every_message_in_every_phase(phase, kind):
    assert refusal(state_in(phase), kind) == expected(phase, kind)


ops = st.lists(st.sampled_from(["attach", "begin", "end", "end_other", "detach", "gone"]), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_transitions_keep_the_invariants(seq):
    s = ConnectionState()
    for op in seq:
        before = s.phase
        try:
            {"attach": lambda: s.attach("s1", True), "begin": lambda: s.begin_response("r"),
             "end": lambda: s.end_response("r"), "end_other": lambda: s.end_response("other"),
             "detach": s.detach, "gone": s.gone}[op]()
        except RuntimeError:
            assert (op, before) in {("attach", p) for p in Phase if p is not Phase.NO_SESSION} | {
                ("begin", p) for p in Phase if p is not Phase.READY}
            assert s.phase is before  # a refused transition changes nothing
        if before is Phase.GONE:
            assert s.phase is Phase.GONE  # nothing leaves GONE
        assert (s.session_id is None) == (s.phase is Phase.NO_SESSION) or s.phase is Phase.GONE
        assert (s.response_id is not None) == (s.phase is Phase.RESPONDING) or s.phase is Phase.GONE
        for kind in CLIENT_TYPES:
            assert refusal(s, kind) == expected(s.phase, kind)


class Closer:
    def __init__(self) -> None:
        self.closed: list[str] = []

    async def __call__(self, sid: str) -> None:
        self.closed.append(sid)


def test_grace_zero_closes_what_the_connection_owns():
    async def main():
        closer = Closer()
        owners = SessionOwners(closer, 0)
        a, b = owners.new_connection(), owners.new_connection()
        owners.claim(a, "s1", False, attach=True)
        owners.claim(a, "s1-fork", False, attach=False)
        owners.claim(b, "s2", True, attach=True)
        with pytest.raises(ProtocolError) as info:
            owners.resume(b, "s1", "ev")
        assert (info.value.code, info.value.event_id) == ("session_in_use", "ev")
        owners.forget("s2")  # b closed its session
        assert owners.resume(b, "s1-fork") is False  # a fork a connection does not drive moves over
        await owners.disconnect(a)
        assert closer.closed == ["s1"] and owners.owned(b) == ["s1-fork"]
        await owners.disconnect(b)
        assert closer.closed == ["s1", "s1-fork"] and owners.num_sessions == 0

    asyncio.run(main())


def test_grace_keeps_detached_sessions_until_resumed_or_expired():
    async def main():
        closer = Closer()
        owners = SessionOwners(closer, 0.2)
        a, b = owners.new_connection(), owners.new_connection()
        owners.claim(a, "s1", True, attach=True)
        owners.claim(a, "s2", False, attach=False)
        await owners.disconnect(a)
        assert sorted(owners.detached()) == ["s1", "s2"] and closer.closed == []
        assert owners.resume(b, "s1") is True  # its return_routes option came along
        await asyncio.sleep(0.4)
        assert closer.closed == ["s2"] and owners.owned(b) == ["s1"] and owners.detached() == []
        with pytest.raises(ProtocolError):
            owners.resume(owners.new_connection(), "s1")  # attached to b
        assert owners.resume(b, "unknown") is False  # never seen here: the caller asks the engine
        owners.forget("unknown")
        await owners.disconnect(b)
        await asyncio.sleep(0.4)
        assert closer.closed == ["s2", "s1"] and owners.num_sessions == 0

    asyncio.run(main())


def test_a_session_being_closed_is_not_resumable():
    async def main():
        gate = asyncio.Event()

        async def slow_close(sid: str) -> None:
            await gate.wait()

        owners = SessionOwners(slow_close, 0)
        a = owners.new_connection()
        owners.claim(a, "s1", False, attach=True)
        closing = asyncio.create_task(owners.disconnect(a))
        await asyncio.sleep(0)
        with pytest.raises(ProtocolError) as info:
            owners.resume(owners.new_connection(), "s1")
        assert info.value.code == "closed"
        gate.set()
        await closing
        assert owners.resume(owners.new_connection(), "s1") is False  # closed: the engine will say so

    asyncio.run(main())


@pytest.mark.parametrize("grace", [-1.0, math.nan, math.inf])
def test_grace_must_be_finite_and_non_negative(grace):
    with pytest.raises(ValueError, match="grace"):
        SessionOwners(Closer(), grace)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m", "--realtime-grace-s", str(grace)])
    assert build_parser().parse_args(["serve", "/m", "--realtime-grace-s", "30"]).realtime_grace_s == 30.0
    assert build_parser().parse_args(["serve", "/m"]).realtime_grace_s == 0.0
