"""An agent connection (the framework's ``Connection`` with ``AgentHandlers``) without a server or a
model: a fake front (tests/agent/agent_fakes.py), real agent, tools and task keeper. Every message
is answered (its ack or an error with its event_id), malformed and out-of-order streams never break
the connection, a close releases the front and cancels or keeps the back-end tasks."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execstate.agent.backend import TaskLimits
from execstate.serve.realtime.agent.endpoint import TaskKeeper
from execstate.serve.realtime.agent.handlers import AgentHandlers
from execstate.serve.realtime.agent.messages import AGENT_PROTOCOL
from execstate.serve.realtime.agent.tools import AgentTools
from execstate.serve.realtime.connection import Connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_fakes import FakeFront  # noqa: E402
from agent_helpers import check_stream  # noqa: E402

FAST_TURN = {"end_of_turn_silence_s": 0.05, "resume_after_s": 0.05}


class FakeServer:
    def __init__(self, tools: dict[str, Any] | None = None, token_delay: float = 0.002) -> None:
        self.tools = AgentTools()
        for name, fn in (tools or {}).items():
            self.tools.register(name, fn)
        self.keeper = TaskKeeper()
        self.task_limits = TaskLimits()
        self.agents: dict[str, Any] = {}
        self.model_name = "fake"
        self.fronts: list[FakeFront] = []
        self.token_delay = token_delay

    async def open_front(self, instructions, params, tenant):
        front = FakeFront(token_delay=self.token_delay, prelude=instructions)
        self.fronts.append(front)
        return front, f"sess-{len(self.fronts)}"


class Wire:
    """The connection and what it emitted."""

    def __init__(self, server: FakeServer) -> None:
        self.events: list[dict[str, Any]] = []
        self.conn = Connection(AGENT_PROTOCOL, lambda peer: AgentHandlers(peer, server), self._emit)

    async def _emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    async def send(self, msg: dict[str, Any] | str) -> list[dict[str, Any]]:
        n = len(self.events)
        await self.conn.handle(json.dumps(msg) if isinstance(msg, dict) else msg)
        return self.events[n:]

    async def until(self, pred, timeout: float = 10.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            for e in self.events:
                if pred(e):
                    return e
            await asyncio.sleep(0.005)
        raise AssertionError(f"not seen; events: {[e['type'] for e in self.events]}")

    def errors(self, event_id) -> list[str]:
        return [e["error"]["code"] for e in self.events if e["type"] == "error" and e["event_id"] == event_id]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_out_of_order_messages_get_errors_with_their_event_ids():
    async def main():
        server = FakeServer()
        w = Wire(server)
        assert (await w.send({"type": "input_text.append", "text": "hi", "event_id": "a"}))[0]["error"]["code"] \
            == "no_session"
        created = (await w.send({"type": "session.create", "event_id": "c", "session": {"turn": FAST_TURN}}))[0]
        assert created["type"] == "session.created" and created["session"]["id"] == "sess-1"
        assert created["session"]["tools"] == [{"name": "calculator", "runner": "server"},
                                               {"name": "lookup", "runner": "server"}]
        await w.send({"type": "session.create", "event_id": "c2"})
        await w.send({"type": "response.cancel", "event_id": "rc"})
        await w.send({"type": "conversation.item.truncate", "event_id": "tr", "item_id": "resp_9", "played_chars": 1})
        await w.send({"type": "delegation.result.submit", "event_id": "ds", "delegation_id": "dlg_9", "output": "x"})
        await w.send({"type": "delegation.cancel", "event_id": "dc", "delegation_id": "dlg_9"})
        await w.send({"type": "input_text.append", "event_id": "t1", "text": "hi", "t": 5.0})
        await w.send({"type": "input_text.append", "event_id": "t2", "text": "back in time", "t": 1.0})  # = now
        await w.send({"type": "input_text.append", "event_id": "t3", "text": "   "})
        await w.send({"type": "input_text.append", "event_id": "t4", "text": "x", "t": -1})
        await w.send({"type": "session.update", "event_id": "u1", "session": {"instructions": "new"}})
        await w.send({"type": "session.update", "event_id": "u2", "session": {"step_tokens": 0}})
        await w.send({"type": "bogus", "event_id": "b"})
        await w.send("{")
        await w.conn.handle(b"\x00", binary=True)
        got = {k: w.errors(k) for k in ("c2", "rc", "tr", "ds", "dc", "t2", "t3", "t4", "u1", "u2", "b")}
        assert got == {
            "c2": ["session_exists"], "rc": ["no_response"], "tr": ["not_found"], "ds": ["unknown_delegation"],
            "dc": ["unknown_delegation"], "t2": [], "t3": ["invalid"], "t4": ["invalid"], "u1": ["invalid"],
            "u2": ["invalid"], "b": ["unknown_type"]}
        assert w.errors(None)[-2:] == ["invalid_message", "invalid_message"]
        assert w.errors("t1") == []
        await w.until(lambda e: e["type"] == "response.done")
        closed = await w.send({"type": "session.close", "event_id": "z"})
        assert closed[-1] == {"type": "session.closed", "event_id": "z", "session_id": "sess-1"}
        assert server.fronts[0].closed and server.agents == {}
        check_stream(w.events)
        await w.conn.close()

    run(main())


def test_client_tool_round_trip_and_result_errors():
    async def main():
        w = Wire(FakeServer())
        await w.send({"type": "session.create", "event_id": "c", "session": {
            "turn": FAST_TURN, "client_tools": [{"name": "weather"}],
            "delegation": {"rules": [{"pattern": r"weather in (?P<city>\w+)", "tool": "weather"}]}}})
        await w.send({"type": "input_text.append", "text": "the weather in Oslo"})
        created = await w.until(lambda e: e["type"] == "delegation.created")
        assert (created["tool"], created["arguments"], created["runner"]) == ("weather", {"city": "Oslo"}, "client")
        did = created["delegation_id"]
        ack = await w.send({"type": "conversation.item.create", "event_id": "r1", "item": {
            "type": "function_call_output", "call_id": did, "output": "sunny"}})
        assert ack == [{"type": "conversation.item.created", "event_id": "r1", "item": {
            "id": did, "type": "function_call_output", "call_id": did, "output": "sunny"}}]
        await w.send({"type": "delegation.result.submit", "event_id": "r2", "delegation_id": did, "output": "again"})
        assert w.errors("r2") == ["duplicate_result"]
        result = await w.until(lambda e: e["type"] == "delegation.result")
        assert (result["status"], result["result"], result["appended"]) == ("completed", "sunny", True)
        await w.until(lambda e: "The answer is sunny." in e.get("delta", ""))
        # a second delegation, cancelled: its result is then late
        await w.send({"type": "input_text.append", "text": "and the weather in Rome"})
        second = await w.until(lambda e: e["type"] == "delegation.created" and e["delegation_id"] != did)
        cancel = await w.send({"type": "delegation.cancel", "event_id": "x", "delegation_id": second["delegation_id"]})
        assert cancel == [{"type": "delegation.cancelled", "event_id": "x", "delegation_id": second["delegation_id"]}]
        await w.send({"type": "delegation.result.submit", "event_id": "r3", "delegation_id": second["delegation_id"],
                      "output": "rain"})
        await w.send({"type": "delegation.cancel", "event_id": "x2", "delegation_id": second["delegation_id"]})
        assert (w.errors("r3"), w.errors("x2")) == (["late_result"], ["not_open"])
        await w.send({"type": "session.close", "event_id": "z"})
        check_stream(w.events)

    run(main())


def test_server_tool_result_cannot_be_submitted_by_the_client():
    async def main():
        w = Wire(FakeServer({"slow": _gated(asyncio.Event(), [])}))
        await w.send({"type": "session.create", "session": {
            "turn": FAST_TURN, "delegation": {"rules": [{"pattern": "slow", "tool": "slow"}]}}})
        await w.send({"type": "input_text.append", "text": "something slow"})
        created = await w.until(lambda e: e["type"] == "delegation.created")
        await w.send({"type": "delegation.result.submit", "event_id": "s", "delegation_id": created["delegation_id"],
                      "output": "forged"})
        assert w.errors("s") == ["not_client_tool"]
        await w.send({"type": "session.close"})

    run(main())


def _gated(gate: asyncio.Event, log: list[str]):
    async def slow() -> str:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        log.append("finished")
        return "done"

    return slow


def test_disconnect_cancels_tasks_or_keeps_them_when_asked():
    async def one(keep: bool) -> list[str]:
        gate, log = asyncio.Event(), []
        server = FakeServer({"slow": _gated(gate, log)})
        w = Wire(server)
        await w.send({"type": "session.create", "session": {
            "turn": FAST_TURN, "keep_tasks_on_disconnect": keep,
            "delegation": {"rules": [{"pattern": "slow", "tool": "slow"}]}}})
        await w.send({"type": "input_text.append", "text": "something slow"})
        await w.until(lambda e: e["type"] == "delegation.created")
        await asyncio.sleep(0.05)
        assert server.keeper.running == 1
        w.conn.disconnected()
        await w.conn.close()
        assert server.fronts[0].closed and server.agents == {}
        await asyncio.sleep(0.01)
        assert server.keeper.running == (1 if keep else 0)
        gate.set()
        await asyncio.sleep(0.05)
        assert server.keeper.running == 0
        check_stream(w.events)
        return log

    assert run(one(False)) == ["cancelled"]
    assert run(one(True)) == ["finished"]


def test_update_changes_live_settings():
    async def main():
        w = Wire(FakeServer())
        await w.send({"type": "session.create", "session": {"turn": FAST_TURN}})
        up = (await w.send({"type": "session.update", "event_id": "u", "session": {
            "turn": {"backchannel_max_words": 5}, "keep_tasks_on_disconnect": True, "max_response_tokens": 8,
            "delegation": {"rules": [{"pattern": "code of (?P<key>\\w+)", "tool": "lookup"}]}}}))[0]
        assert up["type"] == "session.updated"
        s = up["session"]
        assert (s["turn"]["backchannel_max_words"], s["turn"]["end_of_turn_silence_s"], s["keep_tasks_on_disconnect"],
                s["max_response_tokens"], s["delegation"]["rules"][0]["tool"]) == (5, 0.05, True, 8, "lookup")
        await w.send({"type": "input_text.append", "text": "the code of otter"})
        result = await w.until(lambda e: e["type"] == "delegation.result")
        assert result["result"] == "OT-2290"
        await w.send({"type": "session.close"})

    run(main())


MESSAGES = st.one_of(
    st.builds(lambda text, t: {"type": "input_text.append", "text": text, **({"t": t} if t is not None else {})},
              st.sampled_from(["yes", "ok", "what is 3 times 4", "the code of zebra", "no stop tell me more now", ""]),
              st.one_of(st.none(), st.floats(-1, 3))),
    st.builds(lambda tasks: {"type": "response.cancel", "cancel_tasks": tasks}, st.booleans()),
    st.builds(lambda item, chars: {"type": "conversation.item.truncate", "item_id": item, "played_chars": chars},
              st.sampled_from(["resp_1", "resp_2", "resp_3", "x"]), st.integers(-2, 40)),
    st.builds(lambda d: {"type": "delegation.cancel", "delegation_id": d}, st.sampled_from(["dlg_1", "dlg_2"])),
    st.builds(lambda d: {"type": "delegation.result.submit", "delegation_id": d, "output": "9"},
              st.sampled_from(["dlg_1", "dlg_2"])),
    st.just({"type": "session.update", "session": {"step_tokens": 2}}),
    st.just({"type": "session.create"}),
    st.just({"type": "session.close"}),
    st.sampled_from(['{"type": "input_text.append"}', "[]", '{"type": "nope"}', "\x00"]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(MESSAGES, st.floats(0, 0.03)), max_size=14), st.booleans())
def test_random_event_streams_never_break_the_connection(script, keep):
    """Any stream of messages (valid, malformed, out of order, at random moments): each gets its
    answer or an error with its event_id, the stream keeps the fence, and the close leaves nothing."""

    async def main():
        server = FakeServer({"slow": _gated(asyncio.Event(), [])}, token_delay=0.001)
        w = Wire(server)
        await w.send({"type": "session.create", "event_id": "open", "session": {
            "turn": FAST_TURN, "keep_tasks_on_disconnect": keep, "delegation": {"rules": [
                {"pattern": r"(?P<expression>\d+ times \d+)", "tool": "calculator"},
                {"pattern": r"code of (?P<key>\w+)", "tool": "slow", "arguments": {}}]}}})
        for i, (msg, pause) in enumerate(script):
            if isinstance(msg, dict):
                msg = {**msg, "event_id": i}
            out = await w.send(msg)
            if isinstance(msg, dict) and msg["type"] == "session.create" and not any(
                    e["type"] == "error" for e in out):
                assert out[0]["type"] == "session.created"
            await asyncio.sleep(pause)
        w.conn.disconnected()
        await w.conn.close()
        assert all(f.closed for f in server.fronts) and server.agents == {}
        assert server.keeper.running <= (len(w.events) if keep else 0)
        assert all(e["type"] != "error" or e["error"]["type"] != "server_error" for e in w.events), w.events
        for i, (msg, _) in enumerate(script):  # an error names the message it answers (when it had an id)
            if isinstance(msg, dict) and msg["type"] in ("delegation.cancel", "conversation.item.truncate"):
                answers = [e for e in w.events if e.get("event_id") == i]
                assert answers, f"message {i} ({msg['type']}) got no answer"
        sessions = _split_sessions(w.events)
        for events in sessions:
            check_stream(events)

    run(main())


def _split_sessions(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [[]]
    for e in events:
        out[-1].append(e)
        if e["type"] == "session.closed":
            out.append([])
    return out
