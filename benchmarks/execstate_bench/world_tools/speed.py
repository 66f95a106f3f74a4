"""Speed and numerics of the world model's step (eager vs ``torch.compile``).

- :func:`step_times`: time to the first chunk (committing the start frames + generating chunk 1)
  and per-step latency over a rollout with the rolling window; frames/s = F / step time.
- :func:`kv_parity`: the same step sequence (same start, keys and noise) eager and compiled;
  after every step the K/V of the chunk just committed are compared; returns the max absolute
  difference per step (the two runs never share state: each has its own pool).
- :func:`largest_allocation`: the largest single CPU allocation made during one step (torch
  profiler, ``profile_memory``), to compare with the pool's size: K/V writes are in place.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from execstate.model.world import renderer
from execstate.model.world.interface import WorldModel
from execstate.model.world.rollout import WorldRollout


def _episode(model: WorldModel, seed: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    f = model.spec.frames_per_chunk
    keys = renderer.random_actions(np.random.default_rng(seed), (steps + 1) * f)
    keys[0] = renderer.NONE
    _, frames = renderer.trajectory(renderer.initial_state(seed), keys[:f])
    return keys, frames


def step_times(model: WorldModel, steps: int = 64, seed: int = 0, warmup: int = 0) -> dict[str, Any]:
    """First chunk and per-step latency (ms) of a fresh rollout; ``warmup`` rollouts run first."""
    f = model.spec.frames_per_chunk
    keys, frames = _episode(model, seed, steps)
    for _ in range(warmup):
        ro = WorldRollout(model, seed=seed)
        ro.start(frames, keys[:f])
        for i in range(1, 5):
            ro.step(keys[i * f : (i + 1) * f])
    t0 = time.perf_counter()
    ro = WorldRollout(model, seed=seed)
    ro.start(frames, keys[:f])
    ro.step(keys[f : 2 * f])
    first = time.perf_counter() - t0
    times = []
    for i in range(2, steps + 1):
        t = time.perf_counter()
        ro.step(keys[i * f : (i + 1) * f])
        times.append(time.perf_counter() - t)
    ms = np.array(times) * 1000
    return {
        "numerics": model.spec.numerics, "threads": torch.get_num_threads(), "steps": steps,
        "first_chunk_ms": round(first * 1000, 1), "step_ms_p50": round(float(np.percentile(ms, 50)), 2),
        "step_ms_p99": round(float(np.percentile(ms, 99)), 2),
        "frames_per_s": round(f / float(np.median(times)), 1),
        "frames_per_s_sustained": round(f * len(times) / float(np.sum(times)), 1),
    }


def kv_parity(eager: WorldModel, compiled: WorldModel, steps: int = 16, seed: int = 0) -> list[float]:
    """Max |K/V eager - K/V compiled| of each step's committed chunk (step 0 = the start)."""
    f = eager.spec.frames_per_chunk
    keys, frames = _episode(eager, seed, steps)
    ra, rb = WorldRollout(eager, seed=seed), WorldRollout(compiled, seed=seed)
    diffs = []
    for i in range(steps + 1):
        for ro in (ra, rb):
            if i == 0:
                ro.start(frames, keys[:f])
            else:
                ro.step(keys[i * f : (i + 1) * f])
        slots = [torch.cat([torch.arange(ro.pool.block_size) + b * ro.pool.block_size for b in ro.table[-1]])
                 for ro in (ra, rb)]
        d = max(float((ra.pool.k[:, slots[0]] - rb.pool.k[:, slots[1]]).abs().max()),
                float((ra.pool.v[:, slots[0]] - rb.pool.v[:, slots[1]]).abs().max()))
        diffs.append(d)
    return diffs


def largest_allocation(model: WorldModel, num_blocks: int, steps: int = 3, seed: int = 0) -> dict[str, int]:
    """Bytes of the largest single allocation during ``steps`` steps (after a warm-up step), and
    the pool's bytes, for a rollout whose pool has ``num_blocks`` blocks."""
    from torch.profiler import ProfilerActivity, profile

    f = model.spec.frames_per_chunk
    keys, frames = _episode(model, seed, steps + 2)
    ro = WorldRollout(model, seed=seed, num_blocks=num_blocks)
    ro.start(frames, keys[:f])
    ro.step(keys[f : 2 * f])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for i in range(2, steps + 2):
            ro.step(keys[i * f : (i + 1) * f])
    largest = max((e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0), default=0)
    return {"largest_allocation_bytes": int(largest),
            "pool_bytes": int(ro.pool.k.numel() * ro.pool.k.element_size() * 2)}
