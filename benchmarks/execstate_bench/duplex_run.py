"""Play one scripted conversation (``duplex_script``) against a ``DuplexAgent`` in real time and
record what the metrics need: the agent's events, the script's own marks (turn ends, pauses,
backchannels, barge-ins) and the agent's step and interrupt stats.

The player waits for the agent where a person would: after each turn until the agent's reply
(and, for a delegated question, the spoken answer) is done or ``turn_timeout_s`` passed; for an
interruption, until the reply's first word, then ``interrupt_after_s`` more.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from execstate.agent.agent_events import AgentEvent, ResponseCreated
from execstate.agent.backend import Backend
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import RegexPolicy, Rule
from execstate.agent.duplex import DuplexAgent
from execstate.agent.front import FrontModel
from execstate_bench.duplex_script import Chunk, Conversation

RULES = [Rule(r"what is (?P<a>\d+) times (?P<b>\d+)", "calc"), Rule(r"access code of (?P<name>\w+)", "lookup")]


@dataclass
class Played:
    events: list[AgentEvent] = field(default_factory=list)
    marks: list[dict[str, Any]] = field(default_factory=list)  # {"kind": ..., "t": ..., ...}
    step_s: list[float] = field(default_factory=list)
    interrupts: list[tuple[float, int, float | None]] = field(default_factory=list)  # accept, old epoch, step end
    step_at: list[float] = field(default_factory=list)  # each step's start (time.monotonic)


def make_backend(conv: Conversation, seed: int) -> Backend:
    rng = random.Random(seed)

    async def calc(a: str, b: str) -> str:
        await asyncio.sleep(rng.uniform(0.4, 1.2))
        return str(int(a) * int(b))

    async def lookup(name: str) -> str:
        await asyncio.sleep(rng.uniform(0.4, 1.2))
        return conv.codes[name.lower()]

    return Backend({"calc": calc, "lookup": lookup})


async def play(front: FrontModel, conv: Conversation, config: AgentConfig, seed: int = 0,
               turn_timeout_s: float = 20.0) -> Played:
    agent = DuplexAgent(front, make_backend(conv, seed), RegexPolicy(RULES), config)
    out = Played()
    await agent.start()

    async def consume() -> None:
        async for e in agent.events():
            out.events.append(e)

    consumer = asyncio.get_running_loop().create_task(consume())

    async def feed(chunks: tuple[Chunk, ...], kind: str) -> None:
        for c in chunks:
            if c.gap_s:
                if c.pause:
                    out.marks.append({"kind": "pause", "t0": agent.now(), "t1": agent.now() + c.gap_s})
                await asyncio.sleep(c.gap_s)
            agent.feed(c.text)
            out.marks.append({"kind": "input", "t": agent.now(), "text": c.text, "during": kind})
        out.marks.append({"kind": "turn_end", "t": agent.now(), "during": kind})

    async def until(pred, timeout: float) -> AgentEvent | None:
        end = asyncio.get_running_loop().time() + timeout
        seen = 0
        while asyncio.get_running_loop().time() < end:
            for e in out.events[seen:]:
                if pred(e):
                    return e
            seen = len(out.events)
            await asyncio.sleep(0.005)
        return None

    try:
        for turn in conv.turns:
            t_start = agent.now()
            await feed(turn.chunks, turn.kind)
            t_end = agent.now()
            if turn.kind == "delegated":
                out.marks.append({"kind": "question", "t": t_start, "answer": turn.answer, "tool": turn.tool})
                await until(lambda e, t=t_start: e.type == "response.done" and e.t > t
                            and e.response_id in _result_responses(out.events, t), turn_timeout_s)
            elif turn.kind in ("barge_in", "backchannel"):
                first = await until(lambda e, t=t_start: e.type == "response.output_text.delta" and e.t > t,
                                    turn_timeout_s)
                if first is not None:
                    await asyncio.sleep(turn.interrupt_after_s or 0.0)
                    active = agent.fence.active
                    rid = agent.fence.current.response_id if agent.fence.current is not None else None
                    out.marks.append({"kind": turn.kind, "t": agent.now(), "active": active, "response_id": rid})
                    if turn.kind == "backchannel":
                        await feed(turn.interruption, turn.kind)
                        if rid is not None:
                            await until(
                                lambda e, r=rid: e.type == "response.done" and e.response_id == r, turn_timeout_s
                            )
                        await asyncio.sleep(0.3)
                        continue
                    await feed(turn.interruption, turn.kind)
                    t_end = agent.now()
            # the reply to the last turn: created after it ended, then done
            await until(lambda e, t=t_end: e.type == "response.done" and e.response_id in _created_after(out.events, t)
                        and not agent.fence.active, turn_timeout_s)
            await asyncio.sleep(0.3)
    finally:
        await agent.close()
        await consumer
    out.step_s = list(agent.stats.step_s)
    out.step_at = list(agent.stats.step_at)
    out.interrupts = [(i.t_accept, i.old_epoch, i.t_step_end) for i in agent.stats.interrupts]
    return out


def _result_responses(events: list[AgentEvent], after: float) -> set[str]:
    return {e.response_id for e in events if isinstance(e, ResponseCreated) and e.cause == "result" and e.t > after}


def _created_after(events: list[AgentEvent], after: float) -> set[str]:
    return {e.response_id for e in events if isinstance(e, ResponseCreated) and e.t >= after}
