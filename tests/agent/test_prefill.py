"""The user's turn prefilled and scored while they speak (``agent/prefill.py``).

With the scripted front: partials are speculated in turn (each after rolling back the one
before), scored, and rolled back before the reply, whose context is exactly what it would be
without them. On a real engine (tiny random model): the reply's tokens and the session's context
equal those of the same conversation without speculation, the reply's first step finds the turn's
full blocks computed (``saved``), and the accounting adds up."""

from __future__ import annotations

import asyncio

from agent_fakes import Collector, FakeFront, check_invariants
from test_duplex_engine import tiny_engine  # noqa: F401 - the module-scoped engine fixture

from execstate.agent.config import AgentConfig
from execstate.agent.duplex import DuplexAgent
from execstate.agent.front import SessionFront
from execstate.agent.turn_policy import TurnConfig
from execstate.engine.sampling_params import SamplingParams
from execstate.session.lm.async_sessions import AsyncSessions


async def settled(agent: DuplexAgent, text: str) -> None:
    while agent.prefill.score is None or agent.prefill.score[0] != text:
        await asyncio.sleep(0.002)


def test_partials_are_speculated_scored_and_the_last_one_kept_by_the_reply():
    async def main():
        front = FakeFront(reply=" fine.", token_delay=0.001)
        agent = DuplexAgent(front)
        scores: list[tuple[str, float]] = []
        agent.prefill.on_score.append(lambda text, p: scores.append((text, p)))
        await agent.start()
        col = Collector(agent)
        agent.set_floor(True)
        agent.user_partial("what is the")
        await settled(agent, "what is the")
        agent.user_partial("what is the time?")
        await settled(agent, "what is the time?")
        assert scores == [("what is the", 0.05), ("what is the time?", 0.9)]
        # the first: the pending prelude, then the turn as it enters the context; the second on
        # the front truncated to what they have in common: only the new words
        assert front.speculations == ["SYS\nUser: what is the", " time?"]
        assert front.truncations == [len("SYS\nUser: what is the")]
        assert front.text == "SYS\nUser: what is the time?\n"  # then the cue's first token
        agent.set_floor(False)
        steps = front.steps
        agent.user_turn("what is the time?")
        done = await col.wait_for(lambda e: e.type == "response.done")
        assert done.status == "completed"
        assert front.text == "SYS\nUser: what is the time?\nAgent: fine.\n"
        assert list(front.marks) == [1]  # the base checkpoint is the reply's mark
        assert agent.transcript.token_ids == front.context
        st = agent.prefill.stats
        assert (st.speculations, st.kept, st.saved) == (2, 1, len("SYS\nUser: what is the time?"))
        assert front.steps - steps >= 1 and agent.prefill.score is None
        agent.user_partial("and")  # a new turn: speculated after the reply
        await settled(agent, "and")
        await agent.close()
        await col.task
        check_invariants(col.events)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_turn_that_ends_with_other_words_keeps_only_the_common_prefix():
    async def main():
        front = FakeFront(reply=" ok.", token_delay=0.001)
        agent = DuplexAgent(front)
        await agent.start()
        col = Collector(agent)
        agent.set_floor(True)
        agent.user_partial("book a table")
        await settled(agent, "book a table")
        agent.set_floor(False)
        agent.user_turn("look at the table")
        await col.wait_for(lambda e: e.type == "response.done")
        assert front.truncations == [len("SYS\nUser: ")]  # the words differ from the first one on
        assert front.text == "SYS\nUser: look at the table\nAgent: ok.\n"
        assert agent.transcript.token_ids == front.context
        assert list(front.marks) == [1] and agent.prefill.stats.kept == 1
        assert agent.prefill.stats.saved == len("SYS\nUser: ")
        await agent.close()
        await col.task

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_result_in_between_rolls_the_speculation_back():
    async def main():
        front = FakeFront(reply=" ok.", token_delay=0.001)
        agent = DuplexAgent(front)
        await agent.start()
        col = Collector(agent)
        agent.user_turn("hello")
        await col.wait_for(lambda e: e.type == "response.done")
        agent.set_floor(True)
        agent.user_partial("book a table")
        await settled(agent, "book a table")
        held = front.text
        assert held.endswith("\nUser: book a table\n")
        agent.context.push("result", front.encode("[42]"))  # appended before the turn
        agent.set_floor(False)
        agent.user_turn("book a table")
        await col.wait_for(lambda e: len(col.of("response.done")) == 2, 10)
        assert front.truncations == []  # nothing in common: rolled back to the base, which was released
        assert front.text.endswith("Agent: ok.\n[42]\nUser: book a table\nAgent: ok.\n")
        assert agent.transcript.token_ids == front.context
        assert agent.prefill.stats.kept == 0 and agent.prefill.stats.saved == 0
        await agent.close()
        await col.task

    asyncio.run(asyncio.wait_for(main(), 30))


def test_no_speculation_while_a_reply_is_in_flight_or_when_off():
    async def main():
        front = FakeFront(reply=" " + "word " * 30, token_delay=0.005)
        agent = DuplexAgent(front, config=AgentConfig(max_response_tokens=100))
        await agent.start()
        col = Collector(agent)
        agent.user_turn("hello")
        await col.wait_for(lambda e: e.type == "response.output_text.delta")
        agent.user_partial("wait")
        await asyncio.sleep(0.05)
        assert front.speculations == []
        await agent.close()
        off = DuplexAgent(FakeFront(), config=AgentConfig(speculative_prefill=False))
        await off.start()
        off.user_partial("hello")
        await asyncio.sleep(0.02)
        assert off.prefill.end_tokens == frozenset() and off.front.speculations == []
        await off.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def _drafting_agent():
    front = FakeFront(reply=" ok.", token_delay=0.001, echo=True)  # the reply starts with the words heard
    agent = DuplexAgent(front, config=AgentConfig(step_tokens=4))
    agent.prefill.draft_above = 0.5
    return front, agent


async def drafted(agent: DuplexAgent) -> None:
    while agent.prefill.stats.drafts == 0:
        await asyncio.sleep(0.002)


def test_a_turn_scored_over_has_its_first_step_drafted_and_spoken_when_the_final_matches():
    async def main():
        front, agent = _drafting_agent()
        await agent.start()
        col = Collector(agent)
        agent.set_floor(True)
        agent.user_partial("what is the")  # scored 0.05: not drafted
        await settled(agent, "what is the")
        await asyncio.sleep(0.02)
        assert agent.prefill.stats.drafts == 0
        agent.user_partial("what is the time?")  # scored 0.9: the reply's first step runs now
        await drafted(agent)
        assert front.text == "SYS\nUser: what is the time?\nAgent: wha"  # held, not said
        assert col.of("response.output_text.delta") == []
        steps = front.steps
        agent.set_floor(False)
        agent.user_turn("what is the time?")
        done = await col.wait_for(lambda e: e.type == "response.done")
        deltas = [e.text for e in col.of("response.output_text.delta")]
        assert "".join(deltas) == " what is the time? ok." == done.text
        assert deltas[:4] == [" ", "w", "h", "a"]  # the draft, spoken without a step of its own
        assert front.steps - steps == -(-(len(" what is the time? ok.\n") - 4) // 4)
        assert agent.prefill.stats.drafts_kept == 1 and front.truncations == [len("SYS\nUser: what is the")]
        assert agent.transcript.token_ids == front.context
        await agent.close()
        await col.task
        check_invariants(col.events)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_no_draft_once_the_turn_can_end():
    """``draft_while`` false (the segment ended, the final is in: the turn ends now): the reply's
    first step is not drafted, it streams as it runs."""
    async def main():
        front, agent = _drafting_agent()
        agent.prefill.draft_while = lambda: False
        await agent.start()
        agent.set_floor(True)
        agent.user_partial("what is the time?")
        await settled(agent, "what is the time?")
        await asyncio.sleep(0.05)
        assert agent.prefill.stats.drafts == 0 and front.text.endswith("time?\n")
        await agent.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_drafted_first_tokens_are_discarded_when_the_final_differs():
    async def main():
        front, agent = _drafting_agent()
        await agent.start()
        col = Collector(agent)
        agent.set_floor(True)
        agent.user_partial("what is the time?")
        await drafted(agent)
        assert front.text.endswith("time?\nAgent: wha")
        agent.set_floor(False)
        agent.user_turn("what is the tide?")  # the final: other words
        done = await col.wait_for(lambda e: e.type == "response.done")
        assert done.text == " what is the tide? ok."  # generated from the final's words, not the draft's
        assert "time" not in "".join(e.text for e in col.of("response.output_text.delta"))
        assert front.truncations[-1] == len("SYS\nUser: what is the ti")  # the draft truncated away
        assert front.text == "SYS\nUser: what is the tide?\nAgent: what is the tide? ok.\n"
        assert agent.transcript.token_ids == front.context
        st = agent.prefill.stats
        assert (st.drafts, st.drafts_kept, st.kept) == (1, 0, 1)
        await agent.close()
        await col.task
        check_invariants(col.events)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_new_words_after_a_draft_drop_it_and_a_barge_in_still_cuts_the_reply():
    async def main():
        front, agent = _drafting_agent()
        front.reply = " " + "word " * 20
        agent.config = AgentConfig(step_tokens=4, max_response_tokens=200)
        await agent.start()
        col = Collector(agent)
        agent.set_floor(True)
        agent.user_partial("tell me a story.")
        await drafted(agent)
        agent.user_partial("tell me a story. about the sea")  # the user went on: the draft goes
        await settled(agent, "tell me a story. about the sea")
        assert front.text.endswith("User: tell me a story. about the sea\n")
        agent.set_floor(False)
        agent.user_turn("tell me a story. about the sea")
        await col.wait_for(lambda e: e.type == "response.output_text.delta")
        agent.barge_in(text="wait")
        done = await col.wait_for(lambda e: e.type == "response.done")
        assert done.status == "cancelled" and done.text  # cut where it was, from the final's words
        assert (" tell me a story. about the sea" + front.reply).startswith(done.text)
        assert agent.prefill.stats.drafts_kept == 0
        await agent.close()
        await col.task
        check_invariants(col.events)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_speculation_changes_nothing_but_the_work_on_a_real_engine(tiny_engine):  # noqa: F811
    turn = "please tell me a long story about the quiet sea and the boats that sail on it every morning"

    async def converse(speculate: bool, sessions: AsyncSessions):
        front = await SessionFront.open(tiny_engine, "You are a voice assistant.",
                                        SamplingParams(temperature=0.0, max_tokens=4), sessions=sessions)
        agent = DuplexAgent(front, config=AgentConfig(turn=TurnConfig(end_of_turn_silence_s=30),
                                                      max_response_tokens=8, speculative_prefill=speculate))
        await agent.start()
        col = Collector(agent)
        if speculate:
            words = turn.split()
            for k in (4, 9, 14, len(words)):  # growing partials, one revised
                partial = " ".join(words[:k]) if k != 9 else " ".join(words[:8] + ["but"])
                agent.user_partial(partial)
                await settled(agent, partial)
        agent.user_turn(turn)
        done = await col.wait_for(lambda e: e.type == "response.done", 60)
        ids = await front.sessions.token_ids(front.session_id)
        info = await front.sessions.info(front.session_id)
        stats = agent.prefill.stats
        await agent.close()
        await col.task
        return done.text, ids, stats, info

    async def main():
        sessions = AsyncSessions(tiny_engine)  # the engine's one sessions object (the module's other tests')
        spec = await converse(True, sessions)  # first: the turn's blocks are not in the prefix cache yet
        plain = await converse(False, sessions)
        assert spec[0] == plain[0] and spec[1] == plain[1]  # same reply, same context
        stats = spec[2]
        assert stats.speculations == 4 and stats.kept == 1  # the last partial was the turn: the reply kept it
        turn_len = len(tiny_engine.tokenizer.encode("\nUser: " + turn, add_special_tokens=False))
        assert stats.saved > turn_len  # the whole turn (and the prelude) was held by the reply
        # each partial computed only what changed: the revised word and what follows it, plus one
        # token per speculation (the last held one, whose KV a step computes); no recomputed turn
        assert stats.wasted == stats.computed - stats.saved and 4 <= stats.wasted <= 8
        assert plain[2].speculations == plain[2].computed == 0
        assert len(spec[3].checkpoints) == len(plain[3].checkpoints)  # the base checkpoint was released

    asyncio.run(asyncio.wait_for(main(), 120))
