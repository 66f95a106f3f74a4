"""The cancel fence under random interleavings of input, cancels, back-end results and step
completions (a model-free front with real asyncio timing)."""

from __future__ import annotations

import asyncio
import random

from agent_fakes import Collector, FakeFront, check_invariants
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from execstate.agent.backend import Backend
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import RegexPolicy, Rule
from execstate.agent.duplex import DuplexAgent
from execstate.agent.turn_policy import TurnConfig

WORDS = ["yes", "no", "look", "up", "more", "stop", "what", "now"]
op = st.tuples(st.sampled_from(["feed", "feed", "feed", "cancel", "cancel_all", "sleep", "truncate"]),
               st.integers(1, 4), st.floats(0.0, 0.06))


@given(st.lists(op, min_size=1, max_size=25), st.integers(0, 2**16))
# found by hypothesis: the cut of an interrupted reply and a client truncation in one boundary
@example(script=[("feed", 1, 0.0)] * 11 + [("feed", 1, 0.03125), ("cancel", 1, 0.0546875), ("feed", 2, 0.0),
                                           ("truncate", 1, 0.0), ("feed", 1, 0.0)], seed=0)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_interleavings_keep_every_invariant(script, seed):
    rng = random.Random(seed)
    ids = iter(range(10**6))

    async def tool(q):
        n = next(ids)
        await asyncio.sleep(rng.uniform(0, 0.08))
        return f"<{q}:{n}>"  # unique, so a stale result can be told from every other

    async def main():
        front = FakeFront(" " + " ".join(f"w{i}" for i in range(12)) + ".", token_delay=0.002)
        agent = DuplexAgent(front, Backend({"t": tool}), RegexPolicy([Rule(r"look (?P<q>\w+)", "t")]),
                            AgentConfig(turn=TurnConfig(end_of_turn_silence_s=0.05, resume_after_s=0.04),
                                        step_tokens=3, max_response_tokens=30))
        await agent.start()
        col = Collector(agent)
        for kind, n, dt in script:
            if kind == "feed":
                agent.feed(" ".join(rng.choice(WORDS) for _ in range(n)))
            elif kind == "cancel":
                agent.cancel()
            elif kind == "cancel_all":
                agent.cancel(cancel_tasks=True)
            elif kind == "truncate":
                done = [e for e in col.events if e.type == "response.done"]
                if done and agent.transcript.has_mark(done[-1].response_id):
                    agent.truncate(done[-1].response_id, played_chars=n)
            await asyncio.sleep(dt)
        await asyncio.sleep(0.3)
        n_done = len(col.of("response.done"))
        agent.feed("final")  # one more turn: its boundary applies every pending truncation
        await col.wait_for(lambda e: e.type == "response.done" and e.status == "completed"
                           and len(col.of("response.done")) > n_done)
        await asyncio.sleep(0.05)
        if not agent.fence.active and not agent.context.replaying:  # the front holds exactly the transcript
            assert front.text == "".join(map(chr, agent.transcript.token_ids))
        await agent.close(cancel_tasks=False)
        await col.task
        check_invariants(col.events)
        spoken = {e.response_id: e.epoch for e in col.events if e.type == "response.created"}
        results = {e.delegation_id: e for e in col.events if e.type == "delegation.result"}
        created = {e.delegation_id: e for e in col.events if e.type == "delegation.created"}
        for did, r in results.items():
            assert r.status in ("completed", "stale")
            if r.status == "completed":  # appended only in the epoch the delegation was made in
                assert r.epoch == created[did].epoch
            else:  # a stale result is never spoken
                assert r.result not in "".join(e.text for e in col.events if e.type == "response.done")
        for e in col.events:  # a result response speaks in the epoch the result was appended in
            if e.type == "response.created" and e.cause == "result":
                assert spoken[e.response_id] == e.epoch
        assert front.closed and not front.stepping and agent.backend.running == []

    asyncio.run(asyncio.wait_for(main(), 30))
