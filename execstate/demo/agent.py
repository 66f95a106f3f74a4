"""Part 3 of the tour: a full-duplex agent conversation with a delegation and a barge-in.

The front is an LM session of the real ``smollm2-135m`` (interactive priority, 4 tokens a step);
the back end is two Python tools. The script is the one the agent docs show: a question the
policy delegates to a calculator (the front speaks an acknowledgement, then the result), a long
question that the user interrupts mid-reply (barge-in: the reply is cancelled at once, its epoch
fenced off), and a delegated lookup. The timeline prints each event on the agent clock.
"""

from __future__ import annotations

import asyncio
import re
import time

from execstate.agent.agent_events import AgentEvent, OutputDelta, ResponseCreated, ResponseDone, TurnEvent

SCRIPT_CODES = {"zebra": "ZX-4417"}
TURN_TIMEOUT_S = 30.0


async def _calculator(expression: str) -> str:
    a, b = (int(x) for x in re.findall(r"\d+", expression)[:2])
    await asyncio.sleep(0.2)  # a back end slower than the front
    return str(a * b)


async def _lookup(key: str) -> str:
    await asyncio.sleep(0.3)
    return SCRIPT_CODES.get(key.lower(), "unknown")


def run_agent(model: str = "smollm2-135m") -> bool:
    return asyncio.run(_run(model))


async def _run(model: str) -> bool:
    from execstate.agent.backend import Backend
    from execstate.agent.config import AgentConfig
    from execstate.agent.delegation import RegexPolicy, Rule
    from execstate.agent.duplex import DuplexAgent
    from execstate.agent.front import SessionFront
    from execstate.agent.turn_policy import TurnConfig
    from execstate.engine.async_engine import AsyncEngine
    from execstate.engine.config import EngineConfig
    from execstate.model.registry import resolve_model

    t0 = time.perf_counter()
    resolve_model(model)
    engine = AsyncEngine.from_config(EngineConfig(model=model, seed=0, max_model_len=2048))
    try:
        front = await SessionFront.open(engine, "A helpful voice assistant talks with a user.")
        policy = RegexPolicy([Rule(r"(?P<expression>\d+ times \d+)", "calculator"),
                              Rule(r"code of (?P<key>\w+)", "lookup", ack="One moment.")])
        config = AgentConfig(turn=TurnConfig(end_of_turn_silence_s=0.5, backchannel_max_words=2),
                             max_response_tokens=16)
        agent = DuplexAgent(front, Backend({"calculator": _calculator, "lookup": _lookup}), policy, config)
        print(f"front: {model} (engine start {time.perf_counter() - t0:.1f} s); tools: calculator, lookup")
        await agent.start()
        events: list[AgentEvent] = []
        consumer = asyncio.get_running_loop().create_task(_consume(agent, events))
        await _say(agent, "Hi! What is 17 times 23?")
        await _until(events, lambda e: e.type == "response.done" and _cause(events, e) == "result")
        await _say(agent, "Tell me about the history of Rome.")
        await _until(events, lambda e: e.type == "response.output_text.delta" and "Rome" in _turn_text(events, e))
        await asyncio.sleep(0.1)
        await _say(agent, "Wait, no, what is the code of zebra?")
        await _until(
            events, lambda e: e.type == "delegation.result" and e.status == "completed" and e.result == "ZX-4417"
        )
        await _until(events, lambda e: e.type == "response.done" and _cause(events, e) == "result"
                     and "ZX" in (e.text or ""))
        await agent.close()
        await consumer
    finally:
        engine.shutdown()
    return _report(events, time.perf_counter() - t0)


async def _say(agent, text: str) -> None:  # noqa: ANN001 - DuplexAgent
    print(f"{agent.now():7.2f} s  user    {text}")
    agent.feed(text)


async def _consume(agent, events: list[AgentEvent]) -> None:  # noqa: ANN001 - DuplexAgent
    texts: dict[str, list[str]] = {}
    async for e in agent.events():
        events.append(e)
        if e.type == "response.output_text.delta":
            texts.setdefault(e.response_id, []).append(e.text)
        elif e.type == "response.done":
            said = "".join(texts.pop(e.response_id, [])).strip()
            print(f"{e.t:7.2f} s  agent   [{e.response_id} {e.status}: {e.reason}] {said!r}")
        elif e.type == "input.turn":
            print(f"{e.t:7.2f} s  turn    {e.kind} (epoch {e.epoch})")
        elif e.type == "delegation.created":
            args = ", ".join(f"{k}={v!r}" for k, v in e.arguments.items())
            print(f"{e.t:7.2f} s  tool    {e.delegation_id}: {e.tool}({args}) started")
        elif e.type == "delegation.result":
            print(f"{e.t:7.2f} s  tool    {e.delegation_id}: {e.status} -> {e.result!r}")
        elif e.type == "error":
            print(f"{e.t:7.2f} s  error   {e.code}: {e.message}")


async def _until(events: list[AgentEvent], pred, timeout: float = TURN_TIMEOUT_S) -> None:  # noqa: ANN001
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        if any(pred(e) for e in events):
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the agent did not answer in time")


def _cause(events: list[AgentEvent], done: ResponseDone) -> str | None:
    return next((e.cause for e in events if isinstance(e, ResponseCreated) and e.response_id == done.response_id),
                None)


def _turn_text(events: list[AgentEvent], delta: AgentEvent) -> str:
    turns = [e.text for e in events if isinstance(e, TurnEvent) and e.t <= delta.t]
    return turns[-1] if turns else ""


def _report(events: list[AgentEvent], seconds: float) -> bool:
    """The checks: the delegated answer is spoken, the barge-in cancelled the reply in flight and
    nothing of it came after its terminal event."""
    done = {e.response_id: e for e in events if isinstance(e, ResponseDone)}
    spoken = " ".join(e.text or "" for e in done.values() if e.status == "completed")
    barged = [e for e in done.values() if e.status == "cancelled" and e.reason == "barge_in"]
    late = [e for e in events if isinstance(e, OutputDelta) and e.response_id in done
            and e.t > done[e.response_id].t]
    ok = "391" in spoken and "ZX-4417" in spoken and len(barged) == 1 and not late
    print(f"checks: answer 391 spoken {'391' in spoken}; lookup spoken {'ZX-4417' in spoken}; replies cut by the "
          f"barge-in {len(barged)}; deltas after their reply's end {len(late)}")
    print(f"agent part {'passed' if ok else 'FAILED'} in {seconds:.1f} s")
    return ok
