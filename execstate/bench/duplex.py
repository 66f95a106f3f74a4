"""``execstate bench duplex``: a full-duplex agent on scripted timed conversations (issue 10).

Parts, each on a fresh ``AsyncEngine`` of the front model (``smollm2-135m`` by default), torch on
``threads`` threads, greedy decoding:

1. ``conversations``: ``conversations`` scripted conversations (``duplex_script``: turns with
   pauses, delegated questions with known answers, barge-ins and backchannels at random points)
   played in real time (``duplex_run``), under each turn-policy setting in ``silences`` (the
   end-of-turn silence; a sentence-final chunk ends the turn after ``final_silence_s``).
   Metrics: ``duplex_metrics``.
2. ``load``: front step latency with no load, under a saturating back-end load (``load_tasks``
   back-end model tasks, ``ModelTool`` sessions in the batch class, on the front's engine) with
   the front in the interactive class, and with the front in the batch class (no priority).

A PNG timeline of the first conversation (``duplex_plot``) is written to ``png`` when given.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from execstate.agent.backend import ModelTool
from execstate.agent.config import AgentConfig
from execstate.agent.front import DEFAULT_FRONT_PARAMS, SessionFront
from execstate.agent.turn_policy import TurnConfig
from execstate.bench.duplex_metrics import pct, summarize
from execstate.bench.duplex_run import Played, play
from execstate.bench.duplex_script import PLAIN, SUBJECTS, Conversation, Turn, _chunks, make_conversation
from execstate.bench.machine import cpu_name, loadavg_1m
from execstate.bench.models import resolve_bench_model
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.scheduler import PRIORITY_BATCH, PRIORITY_INTERACTIVE

PARTS = ("conversations", "load")
LOAD_MODES = ("no_load", "load_front_interactive", "load_front_batch")


def _engine(path: Path, max_num_seqs: int) -> AsyncEngine:
    return AsyncEngine(LLMEngine(EngineConfig(model=str(path), seed=0, max_num_seqs=max_num_seqs,
                                              kv_cache_memory_bytes=256 << 20)))


async def _conversations(eng: AsyncEngine, convs: list[Conversation], config: AgentConfig) -> list[Played]:
    runs = []
    for i, conv in enumerate(convs):
        front = await SessionFront.open(eng)
        runs.append(await play(front, conv, config, seed=i))
    return runs


async def _load_mode(eng: AsyncEngine, mode: str, config: AgentConfig, tasks: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    conv = Conversation(tuple(Turn("plain", _chunks(rng, rng.choice(PLAIN).format(s=rng.choice(SUBJECTS)), False))
                              for _ in range(4)))
    tool = ModelTool(eng, max_tokens=64, priority=PRIORITY_BATCH)
    stop = asyncio.Event()
    done = [0]

    async def worker(k: int) -> None:
        while not stop.is_set():
            await tool(prompt=f"Write a long essay about {SUBJECTS[k % len(SUBJECTS)]} and {k}.")
            done[0] += 1

    workers = [asyncio.get_running_loop().create_task(worker(k)) for k in range(tasks if mode != "no_load" else 0)]
    await asyncio.sleep(2.0 if workers else 0.0)  # steady state: every slot busy, some waiting
    prio = PRIORITY_BATCH if mode == "load_front_batch" else PRIORITY_INTERACTIVE
    front = await SessionFront.open(eng, sampling_params=DEFAULT_FRONT_PARAMS, priority=prio)
    t0 = time.perf_counter()
    played = await play(front, conv, config, seed=seed)
    wall = time.perf_counter() - t0
    stop.set()
    for w in workers:
        w.cancel()
    for w in workers:
        with contextlib.suppress(BaseException):
            await w
    s = played.step_s
    return {"front_step_ms": {"p50": pct(s, 50), "p99": pct(s, 99), "max": pct(s, 100), "n": len(s)},
            "back_end_tasks_done": done[0], "wall_s": round(wall, 1), "loadavg_1m": loadavg_1m()}


def run_duplex_bench(model: str | Path = "smollm2-135m", *, parts: tuple[str, ...] = PARTS, conversations: int = 4,
                     turns: int = 8, silences: tuple[float, ...] = (0.8, 0.4), step_tokens: int = 4,
                     load_tasks: int = 10, max_num_seqs: int = 8, threads: int | None = 1, seed: int = 0,
                     png: str | Path | None = None) -> dict[str, Any]:
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    if threads:
        torch.set_num_threads(threads)
    path = resolve_bench_model(model)
    report: dict[str, Any] = {"model": str(model), "cpu": cpu_name(), "threads": threads, "step_tokens": step_tokens,
                              "workload": {"conversations": conversations, "turns": turns, "seed": seed}}
    base = AgentConfig(step_tokens=step_tokens, max_response_tokens=32)
    if "conversations" in parts:
        convs = [make_conversation(seed + i, turns) for i in range(conversations)]
        report["conversations"] = {}
        for silence in silences:
            cfg = replace(base, turn=TurnConfig(end_of_turn_silence_s=silence))
            eng = _engine(path, max_num_seqs)
            try:
                la = loadavg_1m()
                runs = asyncio.run(_conversations(eng, convs, cfg))
            finally:
                eng.shutdown()
            report["conversations"][f"silence_{silence}s"] = {**summarize(runs), "loadavg_1m_before": la}
            if png is not None and silence == silences[0]:
                from execstate.bench.duplex_plot import plot_timeline

                plot_timeline(runs[0], Path(png), f"{model}, end-of-turn silence {silence} s, "
                              f"{step_tokens} tokens/step")
                report["png"] = str(png)
    if "load" in parts:
        report["load"] = {"tasks": load_tasks, "max_num_seqs": max_num_seqs}
        for i, mode in enumerate(LOAD_MODES):
            eng = _engine(path, max_num_seqs)
            try:
                report["load"][mode] = asyncio.run(_load_mode(eng, mode, base, load_tasks, seed + i))
            finally:
                eng.shutdown()
    return report


def format_duplex_table(r: dict[str, Any]) -> str:
    lines = [f"bench duplex: {r['model']}, {r['step_tokens']} tokens/front step, {r['threads']} torch thread(s), "
             f"cpu {r['cpu']}"]
    for name, m in r.get("conversations", {}).items():
        lines.append(f"\n[{name}] (1-min load average before: {m['loadavg_1m_before']})")
        for k, v in m.items():
            if k != "loadavg_1m_before":
                lines.append(f"  {k:34s} {v}")
    if "load" in r:
        lines.append(f"\n[front step latency, back-end load: {r['load']['tasks']} model tasks, batch class]")
        for mode in LOAD_MODES:
            if mode in r["load"]:
                lines.append(f"  {mode:24s} {r['load'][mode]}")
    if "png" in r:
        lines.append(f"\ntimeline: {r['png']}")
    return "\n".join(lines)
