"""Finding 6: a client-supplied delegation regex ran on the event loop with Python's
backtracking ``re``: the rule ``(a+)+$`` and the turn ``"a" * 25 + "!"`` stalled every endpoint's
``/health`` for 2.5 s, doubling with each character. Now rules are RE2 (linear time; a pattern
RE2 cannot compile is refused ``invalid``), a user turn is bounded in length, and server tools run
off the loop with a timeout and a per-agent limit on tasks running at once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from bounds_server import Prober, Raw, bounds_served, connect_raw, error_code  # noqa: F401

from execstate.agent.delegation import RegexPolicy, Rule

EVIL = "(a+)+$"
QUICK_TURN = {"end_of_turn_silence_s": 0.05, "final_silence_s": 0.05}


def test_policy_is_re2():
    """RE2 has no backreferences: Python's re would compile this one."""
    with pytest.raises(ValueError, match="not a valid regex"):
        RegexPolicy([Rule(r"(a)\1", "t")])
    policy = RegexPolicy([Rule(EVIL, "t"), Rule(r"code of (?P<key>\w+)", "lookup")])
    for n in (25, 40, 100_000):
        t0 = time.perf_counter()
        assert policy.decide("a" * n + "!") is None
        assert time.perf_counter() - t0 < 0.5  # linear: 100k characters in about a millisecond
    assert policy.decide("What is the Code of Zebra?")[0].arguments == {"key": "Zebra"}  # case-insensitive, groups


def test_evil_rule_does_not_stall_the_server(bounds_served):  # noqa: F811
    """``(a+)+$`` on 26 ``a`` and a ``!``: ~5 s of backtracking with Python's re (2.5 s at 25), a
    few microseconds with RE2. A probe may wait for a scheduling hiccup of this shared machine (a few
    hundred ms at worst); a stall of the loop is seconds. The prober is another process."""
    async def run() -> None:
        async with connect_raw(bounds_served, "agent") as ws:
            c = Raw(ws)
            created = await c.ask({"type": "session.create", "session": {
                "turn": QUICK_TURN, "delegation": {"rules": [{"pattern": EVIL, "tool": "calculator"}]}}})
            assert created["type"] == "session.created", created
            with Prober(bounds_served.url) as probe:
                await asyncio.sleep(0.3)
                await c.send({"type": "input_text.append", "text": "a" * 26 + "!"})
                turn = await c.until(lambda e: e["type"] == "input.turn" and e["kind"] == "end_of_turn", 30)
                assert turn["text"] == "a" * 26 + "!"
                await asyncio.sleep(1.0)
            assert (await c.ask({"type": "session.close"}, "session.closed"))["type"] == "session.closed"
            assert probe.statuses == {200}
            assert probe.worst < 1.0, f"/health waited {probe.worst:.2f} s while the rule matched"

    asyncio.run(run())


def test_patterns_re2_cannot_compile_are_refused(bounds_served):  # noqa: F811
    async def run() -> None:
        async with connect_raw(bounds_served, "agent") as ws:
            c = Raw(ws)
            for pattern in (r"(a)\1", r"(?=a)b", r"(?<!x)y"):
                event = await c.ask({"type": "session.create", "event_id": "c", "session": {
                    "delegation": {"rules": [{"pattern": pattern, "tool": "calculator"}]}}})
                assert error_code(event) == "invalid" and "RE2" in event["error"]["message"], event

    asyncio.run(run())


def test_a_user_turn_is_bounded(bounds_served):  # noqa: F811
    async def run() -> None:
        async with connect_raw(bounds_served, "agent") as ws:
            c = Raw(ws)
            created = await c.ask({"type": "session.create", "session": {"turn": {"end_of_turn_silence_s": 30}}})
            assert created["type"] == "session.created", created
            for i in range(5):  # 5 x 4000 characters in one turn: beyond 16384
                await c.send({"type": "input_text.append", "event_id": i, "text": "word " * 800})
            await c.send({"type": "session.close", "event_id": "end"})
            events = [await c.recv(30)]
            while events[-1]["type"] != "session.closed":
                events.append(await c.recv(30))
            refused = [e for e in events if error_code(e) == "invalid"]
            assert [e["event_id"] for e in refused] == [4], events
            assert "at most 16384 characters" in refused[0]["error"]["message"]

    asyncio.run(run())


def _tool_session(rule_tool: str) -> dict:
    return {"turn": QUICK_TURN, "delegation": {"rules": [{"pattern": r"sleep (?P<key>\w+)", "tool": rule_tool}]}}


def test_tools_time_out_and_are_limited_per_agent(bounds_served):  # noqa: F811
    from execstate.agent.backend import TaskLimits

    release = threading.Event()

    def sleepy(key: str) -> str:  # a sync tool that hangs (until the test ends)
        release.wait(60)
        return key

    agent_server = bounds_served.app.state.agent
    agent_server.tools.register("sleepy", sleepy)
    before = agent_server.task_limits

    async def turn(c: Raw, word: str) -> dict:
        await c.send({"type": "input_text.append", "text": f"please sleep {word} now."})
        outcome = await c.until(lambda e: e["type"] == "delegation.created" or (
            e["type"] == "error" and e["error"]["code"] == "too_many_tasks"), 30)
        await c.until(lambda e: e["type"] == "response.done", 30)  # the answer to the turn: the floor is free
        return outcome

    async def run() -> None:
        async with connect_raw(bounds_served, "agent") as ws:  # a timeout of 0.5 s
            agent_server.task_limits = TaskLimits(timeout_s=0.5, max_tasks=8)
            c = Raw(ws)
            assert (await c.ask({"type": "session.create", "session": _tool_session("sleepy")}))["type"] == \
                "session.created"
            created = await turn(c, "one")
            assert created["type"] == "delegation.created", created
            t0 = time.monotonic()
            result = await c.until(lambda e: e["type"] == "delegation.result", 30)
            assert result["status"] == "failed" and result["error"].startswith("timeout"), result
            assert time.monotonic() - t0 < 10
        async with connect_raw(bounds_served, "agent") as ws:  # at most 2 tasks at once
            agent_server.task_limits = TaskLimits(timeout_s=30, max_tasks=2)
            c = Raw(ws)
            assert (await c.ask({"type": "session.create", "session": _tool_session("sleepy")}))["type"] == \
                "session.created"
            outcomes = [await turn(c, w) for w in ("one", "two", "three")]
            assert [e["type"] for e in outcomes] == ["delegation.created", "delegation.created", "error"], outcomes
            await c.ask({"type": "session.close"}, "session.closed")

    try:
        asyncio.run(run())
    finally:
        agent_server.task_limits = before
        release.set()
