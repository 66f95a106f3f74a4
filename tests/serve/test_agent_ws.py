"""The agent socket end to end: a real uvicorn, the tiny random model as the front (its text is
noise, so the checks are on structure, ids, epochs, forced text and tokens). Barge-in (no old-epoch
delta after the cancelled response.done), a delegated result spoken, a stale result never spoken,
truncation of the stored context, disconnects (front released; tasks cancelled or kept), several
agents at once, errors that leave the connection usable."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest
from agent_helpers import agent_client, check_stream, open_agent
from realtime_helpers import slow_steps, wait_released

from execstate.identity.tenant import LOCAL_TENANT
from execstate.session.runtime.access import AGENTS, Access, Owner

CALC_RULE = {"pattern": r"(?P<expression>\d+ times \d+)", "tool": "calculator"}
TURN = {"end_of_turn_silence_s": 0.2, "resume_after_s": 0.2}
_names = itertools.count()


def run(coro, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


FRONTS = Access(Owner(LOCAL_TENANT, AGENTS), "agent")  # agents' fronts: their own realm, held by the agent socket


def session_tokens(served, sid: str) -> list[int]:
    return served.sessions.call(lambda s: s.token_ids(sid, FRONTS))


def test_barge_in_cancels_and_no_old_epoch_delta_follows(served):
    async def main():
        async with agent_client(served.url) as c:
            await open_agent(c, turn=TURN, max_response_tokens=400)
            await c.send({"type": "input_text.append", "text": "tell me a long story"})
            first = await c.wait_for(lambda e: e["type"] == "response.output_text.delta")
            await c.send({"type": "input_text.append", "text": "no stop that and listen", "event_id": "b"})
            done = await c.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"]
                                    == first["response_id"])
            turn = await c.wait_for(lambda e: e["type"] == "input.turn" and e["kind"] == "barge_in")
            nxt = await c.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"]
                                   != first["response_id"])
            await c.ask({"type": "session.close", "event_id": "z"}, "session.closed")
            events = c.events
        assert done["response"]["status"] == "cancelled" and done["response"]["status_details"] == {
            "reason": "barge_in"}
        assert (done["epoch"], turn["epoch"], nxt["epoch"]) == (0, 1, 1)
        i = events.index(done)
        assert not [e for e in events[i + 1:] if e["type"] != "usage" and e.get("response_id") == first["response_id"]]
        assert not [e for e in events[i + 1:] if e["type"] == "response.output_text.delta" and e["epoch"] == 0]
        usage = events[i + 1]
        assert usage["type"] == "usage" and usage["response_id"] == first["response_id"]
        assert usage["output_tokens"] >= 1
        check_stream(events)

    with slow_steps(served.engine, 0.01):
        run(main())
    wait_released(served.sessions)


def test_delegated_result_is_spoken(served):
    async def main():
        async with agent_client(served.url) as c:
            await open_agent(c, turn=TURN, delegation={"rules": [CALC_RULE]})
            await c.send({"type": "input_text.append", "text": "hi, what is 17 times 23?", "event_id": "q"})
            said = await c.wait_for(lambda e: e["type"] == "response.done" and "The answer is 391."
                                    in e["response"]["output_text"])
            await c.ask({"type": "session.close"}, "session.closed")
            events = c.events
        created = next(e for e in events if e["type"] == "delegation.created")
        result = next(e for e in events if e["type"] == "delegation.result")
        assert (created["tool"], created["arguments"], created["source"], created["runner"]) == (
            "calculator", {"expression": "17 times 23"}, "policy", "server")
        assert (result["delegation_id"], result["status"], result["result"], result["appended"]) == (
            created["delegation_id"], "completed", "391", True)
        spoken = next(e for e in events if e["type"] == "response.output_text.delta" and "391" in e["delta"])
        assert events.index(result) < events.index(spoken) and said["response"]["status"] == "completed"
        ack = next(e for e in events if e["type"] == "response.output_text.delta")
        assert ack["delta"] == " Let me check."  # the acknowledgement, spoken while the task ran
        check_stream(events)

    run(main())
    wait_released(served.sessions)


def test_stale_result_is_never_spoken_after_a_barge_in(served):
    gate = threading.Event()
    name = f"gated_{next(_names)}"
    served.app.state.agent.tools.register(name, lambda key: gate.wait(30) and "ZX-4417")

    async def main():
        async with agent_client(served.url) as c:
            s = await open_agent(c, turn=TURN, max_response_tokens=400, tools=[name], delegation={"rules": [
                {"pattern": r"code of (?P<key>\w+)", "tool": name}]})
            await c.send({"type": "input_text.append", "text": "the code of zebra please"})
            created = await c.wait_for(lambda e: e["type"] == "delegation.created")
            await c.wait_for(lambda e: e["type"] == "response.output_text.delta")
            await c.send({"type": "input_text.append", "text": "no forget it tell me a joke"})
            await c.wait_for(lambda e: e["type"] == "response.done" and e["response"]["status"] == "cancelled")
            gate.set()
            stale = await c.wait_for(lambda e: e["type"] == "delegation.result")
            await c.wait_for(lambda e: e["type"] == "response.done" and e["epoch"] == 1)
            tokens = session_tokens(served, s["id"])
            await c.ask({"type": "session.close"}, "session.closed")
            events = c.events
        assert (stale["delegation_id"], stale["status"], stale["result"], stale["appended"]) == (
            created["delegation_id"], "stale", "ZX-4417", False)
        assert not [e for e in events if "ZX" in e.get("delta", "")]
        assert "ZX-4417" not in served.engine.tokenizer.decode(tokens)
        check_stream(events)

    with slow_steps(served.engine, 0.01):
        run(main())
    wait_released(served.sessions)


def test_truncate_cuts_the_stored_context_to_what_was_played(served):
    async def main():
        async with agent_client(served.url) as c:
            s = await open_agent(c, turn=TURN, max_response_tokens=12)
            await c.send({"type": "input_text.append", "text": "say something"})
            done = await c.wait_for(lambda e: e["type"] == "response.done")
            rid = done["response"]["id"]
            deltas = [e["delta"] for e in c.events if e["type"] == "response.output_text.delta"
                      and e["response_id"] == rid]
            played = len(deltas[0]) + len(deltas[1])
            cut = await c.ask({"type": "conversation.item.truncate", "event_id": "t", "item_id": rid,
                               "played_chars": played})
            assert cut["type"] == "conversation.item.truncated", cut
            await c.send({"type": "input_text.append", "text": "go on"})
            await c.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] != rid)
            agent = served.app.state.agent.agents[s["id"]]
            full = list(agent.fence.responses[rid].token_ids)
            kept = agent.transcript.generated(rid)
            context = session_tokens(served, s["id"])
            transcript = agent.transcript.token_ids
            bad = await c.ask({"type": "conversation.item.truncate", "event_id": "t2", "item_id": "resp_99",
                               "audio_end_ms": 100})
            await c.ask({"type": "session.close"}, "session.closed")
        assert cut == {"type": "conversation.item.truncated", "event_id": "t", "item_id": rid, "content_index": 0,
                       "played_chars": played, "kept_tokens": cut["kept_tokens"]}
        assert 1 <= cut["kept_tokens"] < len(full)
        assert kept == full[: cut["kept_tokens"]]
        assert context == transcript  # the session holds exactly the truncated transcript
        assert bad["error"]["code"] == "not_found" and bad["event_id"] == "t2"

    run(main())
    wait_released(served.sessions)


def _slow_tool(log: list[str], gate: threading.Event):
    async def slow() -> str:
        try:
            while not gate.is_set():
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        log.append("finished")
        return "done"

    return slow


@pytest.mark.parametrize("keep", [False, True])
def test_disconnect_releases_the_front_and_cancels_or_keeps_tasks(served, keep):
    log: list[str] = []
    gate = threading.Event()
    name = f"slow_{next(_names)}"
    server = served.app.state.agent
    server.tools.register(name, _slow_tool(log, gate))

    async def main():
        async with agent_client(served.url) as c:
            s = await open_agent(c, turn=TURN, tools=[name], keep_tasks_on_disconnect=keep,
                                 delegation={"rules": [{"pattern": "slow", "tool": name}]})
            await c.send({"type": "input_text.append", "text": "something slow"})
            await c.wait_for(lambda e: e["type"] == "delegation.created")
        return s["id"]

    sid = run(main())
    wait_released(served.sessions)  # the front session is closed, its KV released
    assert sid not in server.agents
    time.sleep(0.2)
    assert server.keeper.running == (1 if keep else 0)
    assert log == ([] if keep else ["cancelled"])
    gate.set()
    for _ in range(200):
        if server.keeper.running == 0:
            break
        time.sleep(0.02)
    assert log == (["finished"] if keep else ["cancelled"]) and server.keeper.running == 0


def test_several_agents_at_once_each_hear_their_own_answer(served):
    questions = [(17, 23), (12, 12), (7, 9)]

    async def one(a: int, b: int):
        async with agent_client(served.url) as c:
            s = await open_agent(c, turn=TURN, delegation={"rules": [CALC_RULE]})
            await c.send({"type": "input_text.append", "text": f"what is {a} times {b}"})
            await c.wait_for(lambda e: e["type"] == "response.done" and "The answer is" in e["response"]["output_text"])
            await c.ask({"type": "session.close"}, "session.closed")
            return s["id"], c.events

    async def main():
        return await asyncio.gather(*(one(a, b) for a, b in questions))

    results = run(main())
    assert len({sid for sid, _ in results}) == 3
    for (a, b), (_, events) in zip(questions, results, strict=True):
        spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert f"The answer is {a * b}." in spoken
        others = [x * y for x, y in questions if x * y != a * b]
        assert not any(f"The answer is {o}." in spoken for o in others)
        check_stream(events)
    wait_released(served.sessions)


def test_bad_frames_get_errors_and_the_agent_goes_on(served):
    async def main():
        async with agent_client(served.url) as c:
            err = await c.ask({"type": "response.cancel", "event_id": "early"})
            assert err["error"]["code"] == "no_session"
            await open_agent(c, turn=TURN, delegation={"rules": [CALC_RULE]})
            await c.send("{not json")
            await c.ws.send(b"\x01\x02")
            for msg, code in [({"type": "input_text.append", "event_id": 1}, "invalid_message"),
                              ({"type": "input_audio_buffer.append", "event_id": 2, "audio": ""}, "unknown_type"),
                              ({"type": "session.create", "event_id": 3}, "session_exists"),
                              ({"type": "session.update", "event_id": 4, "session": {"tools": []}}, "invalid"),
                              ({"type": "delegation.result.submit", "event_id": 5, "delegation_id": "dlg_7",
                                "output": "x"}, "unknown_delegation")]:
                e = await c.ask(msg)
                assert e["type"] == "error" and e["error"]["code"] == code, (msg, e)
            anonymous = [e for e in c.events if e["type"] == "error" and e["event_id"] is None]
            assert [e["error"]["code"] for e in anonymous] == ["invalid_message", "invalid_message"]
            await c.send({"type": "input_text.append", "text": "what is 6 times 7"})
            await c.wait_for(lambda e: e["type"] == "response.done" and "42" in e["response"]["output_text"])
            await c.ask({"type": "session.close"}, "session.closed")
            check_stream(c.events)

    run(main())
    wait_released(served.sessions)


@pytest.mark.slow
def test_smollm2_over_the_socket_speaks_the_answer_and_never_a_stale_one():
    """The real smollm2-135m front: the delegated product is spoken after its result arrived; a
    barge-in cancels the acknowledgement of a slow lookup, whose result then comes stale and is
    never spoken nor stored; the fence holds over the wire."""
    from serve_helpers import running_server

    from execstate.engine.async_engine import AsyncEngine
    from execstate.engine.config import EngineConfig
    from execstate.engine.llm_engine import LLMEngine
    from execstate.model import registry
    from execstate.serve.app import build_app

    engine = AsyncEngine(LLMEngine(EngineConfig(model=str(registry.prepare("smollm2-135m")), seed=0)))
    gate = threading.Event()
    app = build_app(engine, "smollm2-135m")
    app.state.agent.tools.register("vault", lambda key: gate.wait(60) and {"zebra": "ZX-4417"}[key])

    async def main(url: str):
        async with agent_client(url) as c:
            s = await open_agent(c, turn={"end_of_turn_silence_s": 0.3}, max_response_tokens=40, delegation={"rules": [
                CALC_RULE, {"pattern": r"code of (?P<key>\w+)", "tool": "vault"}]})
            await c.send({"type": "input_text.append", "text": "Hi, what is 17 times 23?"})
            said = await c.wait_for(lambda e: e["type"] == "response.done" and "391" in e["response"]["output_text"])
            n = len(c.events)
            await c.send({"type": "input_text.append", "text": "And the code of zebra please"})
            created = await c.wait_for(lambda e: e["type"] == "delegation.created", n)
            await c.wait_for(lambda e: e["type"] == "response.output_text.delta", n)
            await c.send({"type": "input_text.append", "text": "no forget it, tell me a joke"})
            await c.wait_for(lambda e: e["type"] == "response.done" and e["response"]["status"] == "cancelled", n)
            gate.set()
            stale = await c.wait_for(lambda e: e["type"] == "delegation.result" and e["delegation_id"]
                                     == created["delegation_id"], n)
            await c.wait_for(lambda e: e["type"] == "response.done" and e["epoch"] == 1
                             and e["response"]["status"] == "completed", n)
            tokens = app.state.ctx.sessions.call(lambda lm: lm.token_ids(s["id"], FRONTS))
            await c.ask({"type": "session.close"}, "session.closed")
            return said, stale, tokens, c.events

    try:
        with running_server(app) as (url, _):
            said, stale, tokens, events = run(main(url), 300)
        wait_released(app.state.ctx.sessions)
    finally:
        engine.shutdown()
    first_391 = next(e for e in events if e["type"] == "response.output_text.delta" and "391" in e["delta"])
    result = next(e for e in events if e["type"] == "delegation.result" and e["result"] == "391")
    assert result["appended"] and events.index(result) < events.index(first_391)
    assert said["response"]["status"] == "completed"
    assert (stale["status"], stale["result"], stale["appended"]) == ("stale", "ZX-4417", False)
    assert not [e for e in events if "ZX-4417" in e.get("delta", "")]
    assert "ZX-4417" not in engine.tokenizer.decode(tokens)
    check_stream(events)
