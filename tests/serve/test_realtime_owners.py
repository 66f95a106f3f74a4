"""The realtime session owners (which connection holds which session; the grace period), without a model
or a server. The connection's phases: test_realtime_phases.py."""

from __future__ import annotations

import asyncio
import math

import pytest

from execstate.cli import build_parser
from execstate.serve.realtime.errors import ProtocolError
from execstate.serve.realtime.lm.owners import SessionOwners


def K(sid: str, tenant: str = "team-a") -> tuple[str, str]:  # noqa: N802 - a session as the registry names it
    return (tenant, sid)


class Closer:
    def __init__(self) -> None:
        self.closed: list[tuple[str, str]] = []

    async def __call__(self, sid: tuple[str, str]) -> None:
        self.closed.append(sid)


def test_grace_zero_closes_what_the_connection_owns():
    async def main():
        closer = Closer()
        owners = SessionOwners(closer, 0)
        a, b = owners.new_connection(), owners.new_connection()
        owners.claim(a, K("s1"), False, attach=True)
        owners.claim(a, K("s1-fork"), False, attach=False)
        owners.claim(b, K("s2"), True, attach=True)
        with pytest.raises(ProtocolError) as info:
            owners.resume(b, K("s1"), "ev")
        assert (info.value.code, info.value.event_id) == ("session_in_use", "ev")
        owners.forget(K("s2"))  # b closed its session
        assert owners.resume(b, K("s1-fork")) is False  # a fork a connection does not drive moves over
        await owners.disconnect(a)
        assert closer.closed == [K("s1")] and owners.owned(b) == [K("s1-fork")]
        await owners.disconnect(b)
        assert closer.closed == [K("s1"), K("s1-fork")] and owners.num_sessions == 0

    asyncio.run(main())


def test_grace_keeps_detached_sessions_until_resumed_or_expired():
    async def main():
        closer = Closer()
        owners = SessionOwners(closer, 0.2)
        a, b = owners.new_connection(), owners.new_connection()
        owners.claim(a, K("s1"), True, attach=True)
        owners.claim(a, K("s2"), False, attach=False)
        await owners.disconnect(a)
        assert sorted(owners.detached()) == [K("s1"), K("s2")] and closer.closed == []
        assert owners.resume(b, K("s1")) is True  # its return_routes option came along
        await asyncio.sleep(0.4)
        assert closer.closed == [K("s2")] and owners.owned(b) == [K("s1")] and owners.detached() == []
        with pytest.raises(ProtocolError):
            owners.resume(owners.new_connection(), K("s1"))  # attached to b
        assert owners.resume(b, K("unknown")) is False  # never seen here: the caller asks the engine
        owners.forget(K("unknown"))
        await owners.disconnect(b)
        await asyncio.sleep(0.4)
        assert closer.closed == [K("s2"), K("s1")] and owners.num_sessions == 0

    asyncio.run(main())


def test_a_session_being_closed_is_not_resumable():
    async def main():
        gate = asyncio.Event()

        async def slow_close(sid: tuple[str, str]) -> None:
            await gate.wait()

        owners = SessionOwners(slow_close, 0)
        a = owners.new_connection()
        owners.claim(a, K("s1"), False, attach=True)
        closing = asyncio.create_task(owners.disconnect(a))
        await asyncio.sleep(0)
        with pytest.raises(ProtocolError) as info:
            owners.resume(owners.new_connection(), K("s1"))
        assert info.value.code == "closed"
        gate.set()
        await closing
        assert owners.resume(owners.new_connection(), K("s1")) is False  # closed: the engine will say so

    asyncio.run(main())


@pytest.mark.parametrize("grace", [-1.0, math.nan, math.inf])
def test_grace_must_be_finite_and_non_negative(grace):
    with pytest.raises(ValueError, match="grace"):
        SessionOwners(Closer(), grace)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m", "--realtime-grace-s", str(grace)])
    assert build_parser().parse_args(["serve", "/m", "--realtime-grace-s", "30"]).realtime_grace_s == 30.0
    assert build_parser().parse_args(["serve", "/m"]).realtime_grace_s == 0.0
