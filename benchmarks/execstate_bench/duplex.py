"""``execstate bench duplex``: a full-duplex agent on scripted timed conversations.

Parts, each on a fresh ``AsyncEngine`` of the front model (``smollm2-135m`` by default), torch on
``threads`` threads, greedy decoding:

1. ``conversations``: ``conversations`` scripted conversations (``duplex_script``: turns with
   pauses, delegated questions with known answers, barge-ins and backchannels at random points)
   played in real time (``duplex_run``), under each turn-policy setting in ``policies``:
   ``(end-of-turn silence, silence after a sentence-final chunk or None)`` in seconds. The front
   stops a reply at the next ``\nUser:``/``\nAgent:`` or after 32 tokens (``BENCH_FRONT_PARAMS``).
   Metrics: ``duplex_metrics``.
2. ``load``: front step latency with no load, under a saturating back-end load (``load_tasks``
   back-end model tasks, ``ModelTool`` sessions in the batch class, on the front's engine) with
   the front in the interactive class (with the engine's batch budget under interactive steps,
   ``EngineConfig.interactive_batch_budget``, and without one), and with the front in the batch
   class (no priority); ``load_front_interactive_no_hold``: the interactive front with no hold
   after its steps (``EngineConfig.interactive_hold_s`` 0, ``engine/interactive_hold.py``). The
   back end's completed tasks per second show the batch throughput the budget and the hold give
   up. ``batch_budgets``: more budgets to measure the interactive front under
   (``load_front_interactive_budget_N``, on the same conversation as ``load_front_interactive``),
   and then that conversation with no load (``no_load_interactive_conversation``: ``no_load`` plays
   another one). Each mode's ``front_time`` says where its front steps' time went
   (``duplex_front_time``: waits for steps in flight, the forward passes, host work), from the
   engine's step trace (``engine/step_trace.py``).

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
from execstate.agent.front import SessionFront
from execstate.agent.turn_policy import TurnConfig
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scheduler import PRIORITY_BATCH, PRIORITY_INTERACTIVE
from execstate.engine.step_trace import StepTrace
from execstate.session.lm.async_sessions import AsyncSessions
from execstate_bench.duplex_front_time import COMPONENTS, front_time
from execstate_bench.duplex_metrics import pct, summarize
from execstate_bench.duplex_run import Played, play
from execstate_bench.duplex_script import PLAIN, SUBJECTS, Conversation, Turn, _chunks, make_conversation
from execstate_bench.machine import cpu_name, loadavg_1m
from execstate_bench.models import resolve_bench_model

PARTS = ("conversations", "load")
LOAD_MODES = ("no_load", "load_front_interactive", "load_front_interactive_no_budget", "load_front_batch")
# every reply is max_response_tokens long (the model's end of turn ignored), so the scripted
# barge-ins and backchannels find the agent speaking: a 135M model's replies are a few words
BENCH_FRONT_PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
SYSTEM = "<|im_start|>system\nYou are a friendly voice assistant. Answer in two or three sentences.<|im_end|>"
CHATML: dict[str, Any] = {"user_prefix": "\n<|im_start|>user\n", "agent_prefix": "<|im_end|>\n<|im_start|>assistant\n",
          "result_format": "\n<|im_start|>user\n[{tool} result: {result}]"}


def _engine(path: Path, max_num_seqs: int, batch_budget: int | None = EngineConfig.interactive_batch_budget,
            trace: StepTrace | None = None, hold_s: float = EngineConfig.interactive_hold_s) -> AsyncEngine:
    llm = LLMEngine(EngineConfig(model=str(path), seed=0, max_num_seqs=max_num_seqs,
                                 kv_cache_memory_bytes=256 << 20, max_model_len=2048,
                                 interactive_batch_budget=batch_budget, interactive_hold_s=hold_s))
    llm.step_trace = trace
    return AsyncEngine(llm)


async def _conversations(eng: AsyncEngine, convs: list[Conversation], config: AgentConfig) -> list[Played]:
    runs = []
    sessions = AsyncSessions(eng)  # the engine's one sessions object, shared by every front
    for i, conv in enumerate(convs):
        front = await SessionFront.open(eng, SYSTEM, sampling_params=BENCH_FRONT_PARAMS, sessions=sessions)
        runs.append(await play(front, conv, config, seed=i))
    return runs


async def _load_mode(eng: AsyncEngine, mode: str, config: AgentConfig, tasks: int, seed: int,
                     trace: StepTrace) -> dict[str, Any]:
    rng = random.Random(seed)
    conv = Conversation(tuple(Turn("plain", _chunks(rng, rng.choice(PLAIN).format(s=rng.choice(SUBJECTS)), False))
                              for _ in range(4)))
    sessions = AsyncSessions(eng)  # the engine's one sessions object: the tool's and the front's
    tool = ModelTool(eng, max_tokens=64, priority=PRIORITY_BATCH, sessions=sessions)
    stop = asyncio.Event()
    done = [0]

    async def worker(k: int) -> None:
        while not stop.is_set():
            await tool(prompt=f"Write a long essay about {SUBJECTS[k % len(SUBJECTS)]} and {k}.")
            done[0] += 1

    workers = [asyncio.get_running_loop().create_task(worker(k)) for k in range(tasks if mode != "no_load" else 0)]
    await asyncio.sleep(2.0 if workers else 0.0)  # steady state: every slot busy, some waiting
    prio = PRIORITY_BATCH if mode == "load_front_batch" else PRIORITY_INTERACTIVE
    front = await SessionFront.open(eng, SYSTEM, sampling_params=BENCH_FRONT_PARAMS, priority=prio, sessions=sessions)
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
            "back_end_tasks_done": done[0], "back_end_tasks_per_s": round(done[0] / wall, 3), "wall_s": round(wall, 1),
            "loadavg_1m": loadavg_1m(), "front_time": front_time(played.step_at, s, list(trace.records))}


def load_plan(seed: int, batch_budgets: tuple[int, ...] = ()) -> list[tuple[str, str, int | None, float, int]]:
    """The load part's runs, in order: ``(report key, mode, the engine's batch budget, its
    interactive hold in seconds, conversation seed)``. Each of ``LOAD_MODES`` plays its own
    conversation (``seed + i``) with the engine's defaults (but for the budget of
    ``load_front_interactive_no_budget``); ``load_front_interactive_no_hold`` plays
    ``load_front_interactive``'s with no hold (what the hold buys, and the batch work it costs);
    each extra budget plays that conversation too, and with any of them
    ``no_load_interactive_conversation`` plays it with no load (their like-for-like baseline)."""
    budget, hold = EngineConfig.interactive_batch_budget, EngineConfig.interactive_hold_s
    runs: list[tuple[str, str, int | None, float, int]] = [
        (mode, mode, None if mode == "load_front_interactive_no_budget" else budget, hold, seed + i)
        for i, mode in enumerate(LOAD_MODES)]
    runs.append(("load_front_interactive_no_hold", "load_front_interactive", budget, 0.0, seed + 1))
    runs += [(f"load_front_interactive_budget_{b}", "load_front_interactive", b, hold, seed + 1) for b in batch_budgets]
    if batch_budgets:
        runs.append(("no_load_interactive_conversation", "no_load", budget, hold, seed + 1))
    return runs


def run_duplex_bench(model: str | Path = "smollm2-135m", *, parts: tuple[str, ...] = PARTS, conversations: int = 4,
                     turns: int = 8, policies: tuple[tuple[float, float | None], ...] = ((0.8, 0.2), (0.4, None)),
                     step_tokens: int = 4,
                     load_tasks: int = 10, max_num_seqs: int = 8, threads: int | None = 1, seed: int = 0,
                     png: str | Path | None = None, batch_budgets: tuple[int, ...] = ()) -> dict[str, Any]:
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    if threads:
        torch.set_num_threads(threads)
    path = resolve_bench_model(model)
    report: dict[str, Any] = {"model": str(model), "cpu": cpu_name(), "threads": threads, "step_tokens": step_tokens,
                              "workload": {"conversations": conversations, "turns": turns, "seed": seed}}
    base = AgentConfig(step_tokens=step_tokens, max_response_tokens=32, **CHATML)
    if "conversations" in parts:
        convs = [make_conversation(seed + i, turns) for i in range(conversations)]
        report["conversations"] = {}
        for silence, final in policies:
            cfg = replace(base, turn=TurnConfig(end_of_turn_silence_s=silence, final_silence_s=final))
            eng = _engine(path, max_num_seqs)
            try:
                la = loadavg_1m()
                runs = asyncio.run(_conversations(eng, convs, cfg))
            finally:
                eng.shutdown()
            name = f"silence {silence} s, after a sentence end {final if final is None else f'{final} s'}"
            report["conversations"][name] = {**summarize(runs), "loadavg_1m_before": la}
            if png is not None and (silence, final) == policies[0]:
                from execstate_bench.duplex_plot import plot_timeline

                plot_timeline(runs[0], Path(png), f"{model} front, {name}, {step_tokens} tokens/step")
                report["png"] = str(png)
    if "load" in parts:
        report["load"] = {"tasks": load_tasks, "max_num_seqs": max_num_seqs}
        report["load"]["default_batch_budget"] = EngineConfig.interactive_batch_budget
        report["load"]["default_interactive_hold_s"] = EngineConfig.interactive_hold_s
        for name, mode, budget, hold_s, mode_seed in load_plan(seed, batch_budgets):
            trace = StepTrace()
            eng = _engine(path, max_num_seqs, budget, trace, hold_s)
            try:
                report["load"][name] = asyncio.run(_load_mode(eng, mode, base, load_tasks, mode_seed, trace))
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
        for mode, v in r["load"].items():
            if isinstance(v, dict):
                lines.append(f"  {mode:34s} {_load_line(v)}")
    if "png" in r:
        lines.append(f"\ntimeline: {r['png']}")
    return "\n".join(lines)


def _load_line(v: dict[str, Any]) -> str:
    """One load mode: the front's step p50/p99, the back end's tasks/s, and where the front's time
    went (``front_time`` means, ms)."""
    f, ft = v["front_step_ms"], v.get("front_time", {})
    parts = [f"front step p50 {f['p50']} / p99 {f['p99']} ms (n {f['n']})",
             f"back-end tasks/s {v['back_end_tasks_per_s']}"]
    if ft.get("n"):
        parts.append("means, ms: " + ", ".join(f"{k.removesuffix('_ms')} {ft[k]['mean']}" for k in COMPONENTS))
    return "; ".join(parts)
