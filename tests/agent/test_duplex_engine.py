"""DuplexAgent on real engines: a tiny random model (fast: the session's context equals the
agent's transcript after a barge-in and a truncation) and the real smollm2-135m (slow: a
delegated answer spoken after its result arrives; a stale result never spoken)."""

from __future__ import annotations

import asyncio

import pytest
from agent_fakes import Collector, check_invariants

from execstate.agent.backend import Backend
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import RegexPolicy, Rule
from execstate.agent.duplex import DuplexAgent
from execstate.agent.front import SessionFront
from execstate.agent.turn_policy import TurnConfig
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    d = make_random("llama", tmp_path_factory.mktemp("agent_llama"), seed=0)
    write_tokenizer(d)
    eng = AsyncEngine(LLMEngine(EngineConfig(model=str(d), seed=0)))
    yield eng
    eng.shutdown()


def test_session_context_equals_the_transcript_after_barge_in_and_truncate(tiny_engine):
    async def main():
        front = await SessionFront.open(tiny_engine, "sys", SamplingParams(temperature=0.0, max_tokens=4))
        agent = DuplexAgent(front, config=AgentConfig(turn=TurnConfig(end_of_turn_silence_s=0.1, resume_after_s=0.1),
                                                      step_tokens=4, max_response_tokens=40))
        await agent.start()
        col = Collector(agent)
        agent.feed("hello there")
        await col.wait_for(lambda e: e.type == "response.output_text.delta")
        agent.feed("no no no stop")
        cancelled = await col.wait_for(lambda e: e.type == "response.done")
        second = await col.wait_for(lambda e: e.type == "response.done" and e.status == "completed", 60)
        assert (cancelled.status, cancelled.reason) == ("cancelled", "barge_in")
        sid = front.session_id
        assert await front.sessions.token_ids(sid) == agent.transcript.token_ids
        kept = agent.truncate(second.response_id, played_chars=len(second.text) // 2)
        agent.feed("ok")
        await col.wait_for(lambda e: e.type == "response.done" and e.response_id != second.response_id
                           and e.status == "completed", 60)
        assert agent.transcript.generated(second.response_id) == agent.fence.responses[
            second.response_id].token_ids[:kept]
        assert await front.sessions.token_ids(sid) == agent.transcript.token_ids
        info = await front.sessions.info(sid)
        assert len(info.checkpoints) <= agent.transcript.max_marks
        await agent.close()
        await col.task
        check_invariants(col.events)
        assert (await front.sessions.info(sid)).status == "closed"

    asyncio.run(asyncio.wait_for(main(), 120))


@pytest.mark.slow
def test_smollm2_front_speaks_the_delegated_answer_and_never_a_stale_one():
    from execstate.model import registry

    eng = AsyncEngine(LLMEngine(EngineConfig(model=str(registry.prepare("smollm2-135m")), seed=0)))
    gate = asyncio.Event()

    async def calc(a, b):
        await asyncio.sleep(0.2)
        return int(a) * int(b)

    async def lookup(key):
        await gate.wait()
        return {"zebra": "ZX-4417"}[key]

    async def main():
        front = await SessionFront.open(eng)
        agent = DuplexAgent(front, Backend({"calc": calc, "lookup": lookup}), RegexPolicy([
            Rule(r"(?P<a>\d+) times (?P<b>\d+)", "calc"), Rule(r"code of (?P<key>\w+)", "lookup")]),
            AgentConfig(turn=TurnConfig(end_of_turn_silence_s=0.3)))
        await agent.start()
        col = Collector(agent)
        agent.feed("Hi, what is 17 times")
        await asyncio.sleep(0.1)
        agent.feed("23?")
        said = await col.wait_for(lambda e: e.type == "response.done" and "391" in e.text, 60)
        result = col.of("delegation.result")[0]
        first_391 = next(e for e in col.of("response.output_text.delta") if "391" in e.text)
        assert result.status == "completed" and result.t <= first_391.t and said.status == "completed"
        agent.feed("And the code of zebra please")
        await col.wait_for(lambda e: e.type == "delegation.created" and e.tool == "lookup", 60)
        await col.wait_for(lambda e: e.type == "response.output_text.delta" and e.epoch == 0
                           and e.t > col.of("delegation.created")[-1].t, 60)
        agent.feed("no forget it, tell me a joke")  # barge-in: the lookup runs on, its result goes stale
        gate.set()
        stale = await col.wait_for(lambda e: e.type == "delegation.result" and e.status == "stale", 60)
        await col.wait_for(lambda e: e.type == "response.done" and e.epoch == 1 and e.status == "completed", 60)
        await agent.close()
        await col.task
        check_invariants(col.events)
        assert stale.result == "ZX-4417"
        assert all("ZX-4417" not in e.text for e in col.of("response.output_text.delta"))
        assert "ZX-4417" not in eng.tokenizer.decode(agent.transcript.token_ids)

    try:
        asyncio.run(asyncio.wait_for(main(), 240))
    finally:
        eng.shutdown()
