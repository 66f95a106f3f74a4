"""Latencies over the agent socket (a script, not a test): a real uvicorn on 127.0.0.1, one client.

    python tests/serve/agent_ws_measure.py smollm2-135m --turns 20 [--agents 4]   (or a model directory)

Per turn: the user's words (no final punctuation: the turn ends after ``--silence`` s), then, as
soon as the reply's first delta arrives, a one-word backchannel (``input.turn hold``), a five-word
barge-in (``response.done cancelled``), and a ``response.cancel`` of the reply to the barge-in.
Reported (ms, p50 / p90 / max):

- response latency: the end of the user's turn -> the reply's first delta; on the agent clock
  (``input.turn end_of_turn`` t -> delta t) and at the client (append sent + silence -> delta
  received);
- input round trip: ``input_text.append`` sent -> its ``input.turn hold`` received;
- barge-in round trip: the barge-in append sent -> the cancelled ``response.done`` received;
- cancel round trip: ``response.cancel`` sent -> the cancelled ``response.done`` received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_helpers import agent_client, open_agent  # noqa: E402
from serve_helpers import running_server  # noqa: E402

from execstate.engine.async_engine import AsyncEngine  # noqa: E402
from execstate.engine.config import EngineConfig  # noqa: E402
from execstate.engine.llm_engine import LLMEngine  # noqa: E402
from execstate.serve.app import build_app  # noqa: E402

TOPICS = ["the sea", "old maps", "winter birds", "trains", "bread", "the moon", "rivers", "chess", "bees", "clocks"]


async def measure(url: str, turns: int, silence: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in ("response_agent", "response_client", "input_rtt", "barge_in_rtt",
                                                   "cancel_rtt")}
    async with agent_client(url) as c:
        await open_agent(c, turn={"end_of_turn_silence_s": silence, "final_silence_s": None,
                                  "backchannel_max_words": 2, "resume_after_s": 5.0}, max_response_tokens=64)
        for i in range(turns):
            n = len(c.events)
            sent = await c.send({"type": "input_text.append", "text": f"tell me something about {TOPICS[i % 10]}"})
            eot = await c.wait_for(lambda e: e["type"] == "input.turn" and e["kind"] == "end_of_turn", n)
            delta = await c.wait_for(lambda e: e["type"] == "response.output_text.delta", n)
            got = c.arrived[c.events.index(delta)]
            out["response_agent"].append(delta["t"] - eot["t"])
            out["response_client"].append(got - sent - silence)
            rid = delta["response_id"]
            n = len(c.events)
            sent = await c.send({"type": "input_text.append", "text": "mhm"})
            hold = await c.wait_for(lambda e: e["type"] in ("input.turn", "response.done"), n)
            if hold["type"] == "input.turn" and hold["kind"] == "hold":
                out["input_rtt"].append(c.arrived[c.events.index(hold)] - sent)
            n = len(c.events)
            sent = await c.send({"type": "input_text.append", "text": "no wait stop talking now"})
            done = await c.wait_for(lambda e, rid=rid: e["type"] == "response.done" and e["response"]["id"] == rid)
            if done["response"]["status"] == "cancelled":
                out["barge_in_rtt"].append(c.arrived[c.events.index(done)] - sent)
            await c.wait_for(lambda e, rid=rid: e["type"] == "response.output_text.delta" and e["response_id"] != rid,
                             n)
            n = len(c.events)
            sent = await c.send({"type": "response.cancel"})
            done = await c.wait_for(lambda e: e["type"] in ("response.done", "error"), n)
            if done["type"] == "response.done" and done["response"]["status"] == "cancelled":
                out["cancel_rtt"].append(c.arrived[c.events.index(done)] - sent)
        await c.ask({"type": "session.close", "event_id": "end"}, "session.closed")
    return out


async def measure_many(url: str, agents: int, turns: int, silence: float) -> dict[str, list[float]]:
    runs = await asyncio.gather(*(measure(url, turns, silence) for _ in range(agents)))
    return {k: [x for r in runs for x in r[k]] for k in runs[0]}


def summary(xs: list[float]) -> dict[str, float | int]:
    ms = sorted(x * 1000 for x in xs)
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50": round(statistics.median(ms), 1), "p90": round(ms[int(0.9 * (len(ms) - 1))], 1),
            "max": round(ms[-1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="an embedded name (smollm2-135m) or a model directory")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--silence", type=float, default=0.3)
    ap.add_argument("--agents", type=int, default=1, help="agents at once, one connection each")
    args = ap.parse_args()
    if Path(args.model).is_dir():
        path = args.model
    else:
        from execstate.model import registry

        path = str(registry.prepare(args.model))
    engine = AsyncEngine(LLMEngine(EngineConfig(model=path, seed=0)))
    try:
        with running_server(build_app(engine, args.model)) as (url, _):
            res = asyncio.run(measure_many(url, args.agents, args.turns, args.silence))
    finally:
        engine.shutdown()
    print(json.dumps({k: summary(v) for k, v in res.items()}, indent=1))


if __name__ == "__main__":
    main()
