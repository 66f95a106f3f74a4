"""``execstate bench world``: the world-model sessions measured (session/world_*.py).

Parts (each a function returning a JSON-able dict; ``run_world_bench`` runs the chosen ones):

- ``latency``: one session started from a procedural scene, random held keys (``key`` events)
  changing every few steps: step latency p50/p99, chunks and frames per second (sustained), and
  time to the first chunk (``open_session`` committing the start frames + the first step) of a
  new session on the warm model.
- ``events``: event-to-action latency through ``AsyncWorld``: a task steps the session as fast
  as possible, another submits key events at random moments; per event the time from its arrival
  (``submit_event``) to the return of the first step that lists it ``started``, and how many
  steps that took (1 = the next chunk).
- ``checkpoint``: at step N, the time of ``checkpoint()`` and of ``rollback()`` vs recomputing
  the same state (a fresh session replaying the N steps); the rolled-back session's next frames
  equal the original's (checked).
- ``compiled``: the same event sequence eager and under ``torch.compile``: compile (warm-up)
  time, step p50 of each, and the max |K/V eager - K/V compiled| of the chunk committed at every
  step (and the max frame difference in pixel levels).
- ``memory``: a 500-step session with the rolling window: K/V blocks in use (min/max once the
  window is full) and the process's resident memory at steps 50 and 500.
- ``quality``: the grid world: action-following accuracy and PSNR against the renderer
  (``benchmarks/execstate_bench/world_tools/eval.py``); the maze: PSNR/SSIM, walls crossed and spins over scripted play
  (``benchmarks/execstate_bench/world_tools/maze_quality.py``).
- ``serve``: sessions over the socket, one and several at once (``world_serve.py``).

Keys are the model's own (the grid world's moves, the maze's walk, strafe and turn keys).

The machine's load (``os.getloadavg``) is recorded at the start and the end: this bench runs on
a shared CPU box, so its latencies are upper bounds.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import numpy as np
import torch

from execstate.model.world.interface import WorldModel
from execstate.session.world.async_world import AsyncWorld
from execstate.session.world.offline import World, WorldSession, known_scene

PARTS = ("latency", "events", "checkpoint", "compiled", "memory", "quality", "serve")


def _moves(model: WorldModel) -> tuple[str, ...]:
    return tuple(model.spec.keys[1:])


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3) if values else float("nan")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def _drive(s: WorldSession, steps: int, rng: random.Random, moves: tuple[str, ...]) -> list[float]:
    """``steps`` steps with a held key changing every 1-6 steps; step times in ms."""
    times = []
    change = 0
    for i in range(steps):
        if i == change:
            s.submit_event(s.next_event_id(), "key", {"key": rng.choice(moves), "down": True})
            change += rng.randint(1, 6)
        t = time.perf_counter()
        s.step()
        times.append((time.perf_counter() - t) * 1000)
    return times


def bench_latency(model: WorldModel, steps: int = 64, seed: int = 0) -> dict[str, Any]:
    f = model.spec.frames_per_chunk
    with World(model=model, numerics=model.spec.numerics) as world:
        warm = world.open_session(prompt="a meadow maze", seed=seed, scene_seed=known_scene(model.spec, seed))
        _drive(warm, 8, random.Random(seed), _moves(model))
        warm.close()
        t0 = time.perf_counter()
        s = world.open_session(prompt="a meadow maze", seed=seed, scene_seed=known_scene(model.spec, seed + 1))
        s.step()
        first = (time.perf_counter() - t0) * 1000
        times = _drive(s, steps, random.Random(seed + 1), _moves(model))
    total = sum(times) / 1000
    return {"steps": steps, "frames_per_chunk": f, "first_chunk_ms": round(first, 2),
            "step_ms_p50": _pct(times, 50), "step_ms_p99": _pct(times, 99), "step_ms_max": _pct(times, 100),
            "chunks_per_s": round(steps / total, 1), "frames_per_s": round(steps * f / total, 1)}


def bench_events(model: WorldModel, steps: int = 64, seed: int = 0) -> dict[str, Any]:
    world = World(model=model, numerics=model.spec.numerics)
    aw = AsyncWorld(world)
    rng = random.Random(seed)
    lat_ms: list[float] = []
    lat_steps: list[int] = []

    async def main() -> None:
        info = await aw.open(prompt="a meadow maze", seed=seed, scene_seed=known_scene(model.spec, seed))
        sid = info.session_id
        pending: dict[int, int] = {}  # event id -> step index when submitted
        done = asyncio.Event()
        step_ms: list[float] = []

        async def stepper() -> None:
            while len(step_ms) < steps:
                t = time.perf_counter()
                r = await aw.step(sid)
                now = time.perf_counter()
                step_ms.append((now - t) * 1000)
                for eid in r.events["started"]:
                    lat_ms.append((now - aw.received_at[(sid, eid)]) * 1000)
                    lat_steps.append(r.step_index - pending.pop(eid))
            done.set()

        async def submitter() -> None:
            eid = 0
            while not done.is_set():
                await asyncio.sleep(rng.uniform(0, 2.5) * (np.median(step_ms) if step_ms else 0.02) / 1000)
                if done.is_set() or pending:
                    continue  # one event in flight at a time: each is the only one of its boundary
                index = (await aw.info(sid)).step_index
                pending[eid] = index
                await aw.submit_event(sid, eid, "key", {"key": rng.choice(_moves(model)), "down": True})
                eid += 1

        await asyncio.gather(stepper(), submitter())
        await aw.shutdown()

    asyncio.run(main())
    return {"events": len(lat_ms), "event_to_action_ms_p50": _pct(lat_ms, 50),
            "event_to_action_ms_p99": _pct(lat_ms, 99), "event_to_action_ms_max": _pct(lat_ms, 100),
            "steps_to_action_max": max(lat_steps) if lat_steps else None,
            "note": "arrival -> return of the first step listing it started; steps_to_action 1 = the step "
                    "that was running or next when it arrived"}


def bench_checkpoint(model: WorldModel, at_step: int = 32, seed: int = 0, repeats: int = 5) -> dict[str, Any]:
    with World(model=model, numerics=model.spec.numerics) as world:
        s = world.open_session(prompt="a meadow maze", seed=seed, scene_seed=known_scene(model.spec, seed))
        rng = random.Random(seed)
        plan = [rng.choice(_moves(model)) for _ in range(at_step + 4)]
        for k in plan[:at_step]:
            s.step(action=k)
        cp_ms, rb_ms, recompute_ms = [], [], []
        want = None
        for _ in range(repeats):
            t = time.perf_counter()
            cp = s.checkpoint()
            cp_ms.append((time.perf_counter() - t) * 1000)
            got = [s.step(action=k).frames_sha256 for k in plan[at_step:]]
            t = time.perf_counter()
            s.rollback(cp)
            rb_ms.append((time.perf_counter() - t) * 1000)
            s.release_checkpoint(cp)
            want = want or got
            assert got == want
            t = time.perf_counter()
            fresh = world.open_session(prompt="a meadow maze", seed=seed, scene_seed=known_scene(model.spec, seed))
            for k in plan[:at_step]:
                fresh.step(action=k)
            recompute_ms.append((time.perf_counter() - t) * 1000)
            fresh.close()
        same = [s.step(action=k).frames_sha256 for k in plan[at_step:]] == want
    return {"at_step": at_step, "checkpoint_ms_p50": _pct(cp_ms, 50), "rollback_ms_p50": _pct(rb_ms, 50),
            "recompute_ms_p50": _pct(recompute_ms, 50),
            "rollback_speedup": round(_pct(recompute_ms, 50) / max(_pct(rb_ms, 50), 1e-6), 1),
            "rollback_reproduces_frames": same}


def bench_compiled(eager: WorldModel, compiled: WorldModel, steps: int = 32, seed: int = 0) -> dict[str, Any]:
    from execstate_bench.world_numerics import compare_numerics

    return compare_numerics(eager, compiled, steps, seed)


def bench_memory(model: WorldModel, steps: int = 500, seed: int = 0) -> dict[str, Any]:
    with World(model=model, numerics=model.spec.numerics) as world:
        s = world.open_session(prompt="a meadow maze", seed=seed, scene_seed=known_scene(model.spec, seed))
        rng = random.Random(seed)
        used, rss = [], {}
        for i in range(1, steps + 1):
            if i % 5 == 1:
                s.submit_event(s.next_event_id(), "key", {"key": rng.choice(_moves(model)), "down": True})
            used.append(s.step().blocks_in_use)
            if i in (50, steps):
                rss[i] = _rss_mb()
        store = world.sessions.store
        full = used[store.model.spec.sink_chunks + store.model.spec.max_window_chunks:]
        return {"steps": steps, "blocks_per_chunk": store.blocks_per_chunk,
                "blocks_in_use_min_after_fill": min(full), "blocks_in_use_max_after_fill": max(full),
                "kv_bytes_in_use": max(full) * store.kv.bytes_per_block(
                    store.kv.k.shape[0], store.block_size, store.kv.k.shape[2], store.kv.k.shape[3], store.kv.k.dtype),
                "rss_mb_at_50": rss.get(50), f"rss_mb_at_{steps}": rss.get(steps)}


def bench_quality(model: WorldModel, episodes: int = 4, steps: int = 64) -> dict[str, Any]:
    if model.spec.world == "maze":
        from execstate_bench.world_tools import maze_quality as mq

        return mq.report(mq.play(model, steps, scene_seed=3, prompt="a dungeon maze"), model.spec.frames_per_chunk)
    from execstate_bench.world_tools import eval as world_eval

    r = world_eval.evaluate(model, seeds=range(episodes), steps=steps, psnr_steps=8)
    return {k: r[k] for k in ("episodes", "steps", "action_accuracy", "action_accuracy_when_moving",
                              "psnr_by_step", "psnr_mean_first", "psnr_mean_all")}


def run_world_bench(model: str | None = None, parts: tuple[str, ...] = PARTS, steps: int = 64,
                    memory_steps: int = 500, compiled_steps: int = 32, episodes: int = 4,
                    threads: int = 2, png: str | None = None, sessions: tuple[int, ...] = (1, 4),
                    serve_fps: tuple[float, ...] = (0.0, 16.0), serve_seconds: float = 20.0) -> dict[str, Any]:
    from execstate.session.world.offline import load_world_model

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown bench parts {sorted(unknown)}; choose from {PARTS}")
    torch.set_num_threads(threads)
    eager = load_world_model(model, "eager")
    report: dict[str, Any] = {
        "model": eager.spec.model_id, "weights_version": eager.spec.weights_version[:16],
        "frame_shape": list(eager.spec.frame_shape), "frames_per_chunk": eager.spec.frames_per_chunk,
        "threads": threads, "cpus": os.cpu_count(), "load_start": [round(x, 2) for x in os.getloadavg()]}
    t0 = time.perf_counter()
    if "latency" in parts:
        report["latency"] = bench_latency(eager, steps)
    if "events" in parts:
        report["events"] = bench_events(eager, steps)
    if "checkpoint" in parts:
        report["checkpoint"] = bench_checkpoint(eager)
    if "compiled" in parts:
        report["compiled"] = bench_compiled(eager, load_world_model(model, "compiled"), compiled_steps)
    if "memory" in parts:
        report["memory"] = bench_memory(eager, memory_steps)
    if "quality" in parts:
        report["quality"] = bench_quality(eager, episodes, steps)
    if "serve" in parts:
        from execstate_bench.world_serve import bench_serve

        report["serve"] = bench_serve(eager, sessions, serve_fps, serve_seconds)
    if png is not None:  # generated frames above the renderer's, same actions (world_tools/eval.py)
        from pathlib import Path

        from execstate_bench.world_tools import eval as world_eval

        report["png"] = str(world_eval.comparison_png(eager, Path(png)))
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["load_end"] = [round(x, 2) for x in os.getloadavg()]
    return report
