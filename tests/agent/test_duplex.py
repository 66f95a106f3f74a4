"""DuplexAgent with a model-free front (tests/agent/agent_fakes.py): barge-in, backchannels,
delegation, stale results, truncation, tool calls from the front's output, close."""

from __future__ import annotations

import asyncio

import pytest
from agent_fakes import Collector, FakeFront, check_invariants

from execstate.agent.backend import Backend
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import RegexPolicy, Rule
from execstate.agent.duplex import AgentError, DuplexAgent
from execstate.agent.ledger import LedgerError
from execstate.agent.turn_policy import TurnConfig

FAST = TurnConfig(end_of_turn_silence_s=0.15, resume_after_s=0.1)
LONG = " " + " ".join(f"w{i}" for i in range(60)) + "."


def make(front=None, tools=None, rules=(), **cfg):
    front = front or FakeFront(LONG, token_delay=0.003)
    cfg.setdefault("turn", FAST)
    cfg.setdefault("max_response_tokens", 400)
    return DuplexAgent(front, Backend(tools or {}), RegexPolicy(rules), AgentConfig(**cfg)), front


async def settle(agent, front, s=0.3):
    """Wait until nothing runs, then check the front holds exactly the transcript."""
    await asyncio.sleep(s)
    if not agent.fence.active:
        assert front.text == "".join(map(chr, agent.transcript.token_ids)) or agent.context.replaying


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 30))


def test_barge_in_cancels_truncates_to_emitted_and_the_new_turn_follows():
    async def main():
        agent, front = make()
        await agent.start()
        col = Collector(agent)
        agent.feed("hello there")
        first = await col.wait_for(lambda e: e.type == "response.output_text.delta" and "w3" in e.text or
                                   e.type == "response.output_text.delta" and e.text == "3")
        agent.feed("no wait stop")  # 3 words: a barge-in
        assert agent.fence.epoch == first.epoch + 1 and not agent.fence.active  # at once, in the call
        await asyncio.sleep(0.01)
        done = [e for e in col.events if e.type == "response.done"]
        assert [(d.status, d.reason) for d in done] == [("cancelled", "barge_in")]
        assert agent.fence.epoch == first.epoch + 1
        await col.wait_for(lambda e: e.type == "response.done" and e.status == "completed")
        await agent.close()
        await col.task
        check_invariants(col.events)
        r1, r2 = [e for e in col.events if e.type == "response.done"][:2]
        text = front.text
        # the context holds what was emitted of the cancelled reply, then the new turn and reply
        assert f"\nAgent:{r1.text}\nUser: no wait stop\nAgent:{r2.text}" in text
        assert (
            LONG.startswith(r1.text)
            and r1.text.startswith(" w0 w1 w2 w3")
            and agent.stats.interrupts[0].t_step_end is not None
        )
        assert all(e.epoch == 1 for e in col.events if e.type == "response.output_text.delta"
                   and e.response_id == r2.response_id)

    run(main())


def test_backchannel_holds_then_resumes_the_same_response_and_never_enters_the_context():
    async def main():
        agent, front = make()
        await agent.start()
        col = Collector(agent)
        agent.feed("tell me a story")
        await col.wait_for(lambda e: e.type == "response.output_text.delta" and e.text == "5")
        agent.feed("uh huh")
        t_burst = agent.now()
        resume = await col.wait_for(lambda e: e.type == "input.turn" and e.kind == "resume")
        nxt = await col.wait_for(lambda e: e.type == "response.output_text.delta" and e.t > resume.t)
        assert nxt.t - t_burst < 2.0  # the false interruption resumes the turn within 2 s
        await col.wait_for(lambda e: e.type == "response.done")
        await agent.close()
        await col.task
        check_invariants(col.events)
        dones = col.of("response.done")
        assert [d.status for d in dones] == ["completed"] and dones[0].text == LONG
        assert [e.kind for e in col.of("input.turn")] == ["end_of_turn", "hold", "resume"]
        assert "uh huh" not in front.text and agent.fence.epoch == 0

    run(main())


def test_delegated_result_is_appended_and_spoken_and_the_ack_yields_to_it():
    async def main():
        async def calc(a, b):
            await asyncio.sleep(0.05)
            return int(a) + int(b)

        agent, front = make(tools={"calc": calc}, rules=[Rule(r"(?P<a>\d+) plus (?P<b>\d+)", "calc")])
        await agent.start()
        col = Collector(agent)
        agent.feed("what is 19 plus 23")
        res = await col.wait_for(lambda e: e.type == "response.done" and e.text.startswith(" The answer is 42."))
        await agent.close()
        await col.task
        check_invariants(col.events)
        created = col.of("delegation.created")[0]
        assert (created.tool, created.arguments, created.source) == ("calc", {"a": "19", "b": "23"}, "policy")
        result = col.of("delegation.result")[0]
        assert (result.status, result.result, result.appended) == ("completed", "42", True)
        ack = col.of("response.done")[0]
        assert ack.text.startswith(" Let me check.") and ack.reason == "result"
        assert "\n[calc result: 42]\nAgent: The answer is 42." in front.text and res.reason

    run(main())


def test_result_for_an_old_epoch_is_stale_and_never_spoken_and_the_task_was_not_cancelled():
    async def main():
        gate = asyncio.Event()
        calls = []

        async def slow(q):
            calls.append(q)
            await gate.wait()
            return "SECRET"

        agent, front = make(tools={"slow": slow}, rules=[Rule(r"look up (?P<q>\w+)", "slow")])
        await agent.start()
        col = Collector(agent)
        agent.feed("please look up zebra")
        await col.wait_for(lambda e: e.type == "response.output_text.delta" and e.text == "2")
        agent.feed("actually never mind that")  # barge-in: the epoch advances, the task runs on
        gate.set()
        stale = await col.wait_for(lambda e: e.type == "delegation.result")
        await col.wait_for(lambda e: e.type == "response.done" and e.status == "completed")
        await agent.close()
        await col.task
        check_invariants(col.events)
        assert stale.status == "stale" and stale.result == "SECRET" and not stale.appended
        assert "SECRET" not in front.text and all("SECRET" not in e.text for e in col.of("response.output_text.delta"))
        assert calls == ["zebra"]
        with pytest.raises(LedgerError) as exc:
            agent.ledger.resolve(stale.delegation_id, "again", agent.fence.epoch, 9.0)
        assert exc.value.code == "duplicate"

    run(main())


def test_cancel_with_tasks_cancels_them_and_a_late_result_is_refused():
    async def main():
        agent, front = make(tools={"slow": lambda q: q}, rules=[Rule(r"look up (?P<q>\w+)", "slow")])
        agent.backend.tools["slow"] = _never
        await agent.start()
        col = Collector(agent)
        agent.feed("look up it")
        created = await col.wait_for(lambda e: e.type == "delegation.created")
        await col.wait_for(lambda e: e.type == "response.output_text.delta")
        assert agent.cancel(cancel_tasks=True)
        await asyncio.sleep(0.01)
        assert agent.ledger.get(created.delegation_id).state.value == "cancelled"
        with pytest.raises(LedgerError) as exc:
            agent.deliver_result(created.delegation_id, "late")
        assert exc.value.code == "late"
        with pytest.raises(LedgerError) as exc:
            agent.deliver_result("dlg_77", "x")
        assert exc.value.code == "unknown"
        await agent.close()
        await col.task
        check_invariants(col.events)
        assert agent.backend.running == [] and front.closed

    run(main())


async def _never(q):
    await asyncio.Event().wait()


def test_truncate_to_the_played_position():
    async def main():
        agent, front = make()
        await agent.start()
        col = Collector(agent)
        agent.feed("hi")
        await col.wait_for(lambda e: e.type == "response.output_text.delta" and e.text == "9")
        agent.cancel()
        done = await col.wait_for(lambda e: e.type == "response.done")
        with pytest.raises(AgentError, match="exactly one"):
            agent.truncate(done.response_id)
        for bad in ({"played_ms": "x"}, {"played_ms": -5}, {"played_chars": 2.5}, {"played_chars": True}):
            with pytest.raises(AgentError) as exc:
                agent.truncate(done.response_id, **bad)
            assert exc.value.code == "invalid"
        assert agent.truncate(done.response_id, played_chars=7) == 7  # " w0 w1 " is 7 characters
        assert agent.truncate(done.response_id, played_ms=400) == 6  # 15 chars/s: 6 characters, " w0 w1"
        assert agent.truncate(done.response_id, played_chars=100) == 6  # a truncation only ever shortens
        agent.feed("and then what")
        await col.wait_for(lambda e: e.type == "response.done" and e.status == "completed")
        await agent.close()
        await col.task
        assert "\nAgent: w0 w1\nUser: and then what\nAgent:" in front.text
        with pytest.raises(AgentError) as exc:
            agent.truncate("resp_99", played_ms=10)
        assert exc.value.code == "closed"

    run(main())


def test_tool_call_in_the_front_output_is_parsed_validated_and_not_spoken():
    async def main():
        reply = ' Sure. <tool_call>{"name": "calc", "arguments": {"a": 2, "b": 2}}</tool_call> Done.'
        agent, front = make(front=FakeFront(reply, 0.001), tools={"calc": lambda a, b: a + b})
        await agent.start()
        col = Collector(agent)
        agent.feed("two plus two")
        await col.wait_for(lambda e: e.type == "response.done" and "The answer is 4." in e.text)
        await agent.close()
        await col.task
        check_invariants(col.events)
        first = col.of("response.done")[0]
        # the reply yields to the result at the next boundary after it arrived
        assert (
            " Sure.  Done.".startswith(first.text)
            and first.text.startswith(" Sure. ")
            and "tool_call" not in "".join(e.text for e in col.of("response.output_text.delta"))
        )
        c = col.of("delegation.created")[0]
        assert (c.tool, c.arguments, c.source) == ("calc", {"a": 2, "b": 2}, "model")

    run(main())


def test_bad_input_is_refused_clearly():
    async def main():
        agent, _ = make()
        for bad in ("", "   ", 5, "x" * 5000):
            with pytest.raises(AgentError) as exc:
                agent.feed(bad)
            assert exc.value.code == "invalid"
        agent.feed("a", t=1.0)
        with pytest.raises(AgentError, match="last input time"):
            agent.feed("b", t=0.5)
        await agent.start()
        await agent.close()
        with pytest.raises(AgentError) as exc:
            agent.feed("x")
        assert exc.value.code == "closed"

    run(main())


class _BrokenFront(FakeFront):
    async def step(self, input_ids, max_tokens):
        async for c in super().step(input_ids, 2):
            yield c
        if self.steps >= 2:
            raise RuntimeError("context full")


def test_a_failing_front_fails_the_response_once_and_a_failing_tool_is_a_failed_result():
    async def main():
        def boom(q):
            raise KeyError(q)

        agent, front = make(front=_BrokenFront(LONG, 0.001), tools={"t": boom}, rules=[Rule(r"look (?P<q>\w+)", "t")])
        await agent.start()
        col = Collector(agent)
        agent.feed("look here")
        await col.wait_for(lambda e: e.type == "error")
        await col.wait_for(lambda e: e.type == "delegation.result")
        with pytest.raises(AgentError) as exc:
            agent.feed("more")
        assert exc.value.code == "closed"
        await agent.close()
        await col.task
        check_invariants(col.events)
        assert [(d.status, d.reason) for d in col.of("response.done")] == [("failed", "context full")]
        assert [e.code for e in col.of("error")] == ["front_failed"]
        res = col.of("delegation.result")[0]
        assert (res.status, res.error) == ("failed", "KeyError: 'here'") and front.closed

    run(main())
