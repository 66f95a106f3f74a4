"""Eager vs compiled world sessions: the same event sequence through two ``World``s (each its own
pool: they never share state; their state keys differ by the numerics mode in provenance).

After every step (the start chunk included) the K/V of the chunk just committed are compared:
``max |K/V eager - K/V compiled|`` per step. Also the frames' largest difference (uint8 levels),
both modes' step times, and the compiled mode's first step (``torch.compile`` warm-up).
"""

from __future__ import annotations

import random
import time
from typing import Any, cast

import numpy as np
import torch

from execstate.model.world.interface import WorldModel
from execstate.session.world.offline import World, WorldSession, known_scene
from execstate.session.world.state import WorldState


def last_chunk_kv(world: World, s: WorldSession) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V of the session's newest chunk: ``[n_layers, tokens_per_chunk, H, Dh]`` each."""
    store = world.sessions.store
    rec = cast(WorldState, world.sessions.runtime(s.session_id).state).table[-1]
    slots = torch.cat([torch.arange(store.block_size) + b * store.block_size for b in rec.block_ids])
    return store.kv.k[:, slots].clone(), store.kv.v[:, slots].clone()


def compare_numerics(eager: WorldModel, compiled: WorldModel, steps: int = 32, seed: int = 0,
                     scene: bool = True) -> dict[str, Any]:
    if eager.spec.numerics != "eager" or compiled.spec.numerics != "compiled":
        raise ValueError("compare an eager model with a compiled one")
    rng = random.Random(seed)
    plan = [rng.choice(eager.spec.keys) for _ in range(steps)]
    worlds = [World(model=eager), World(model=compiled, numerics="compiled")]
    try:
        h, w, _ = eager.spec.frame_shape
        start = None if scene else np.random.default_rng(seed).integers(
            0, 256, (eager.spec.frames_per_chunk, h, w, 3), dtype=np.uint8)
        kw = {"scene_seed": known_scene(eager.spec, seed)} if scene else {"start_frames": start}
        sessions = [wd.open_session(prompt="a meadow maze", seed=seed, **kw) for wd in worlds]
        keys = [s.state_key() for s in sessions]
        diffs, frame_diff = [], 0
        times: tuple[list[float], list[float]] = ([], [])
        for i in range(steps + 1):
            frames = []
            for j, s in enumerate(sessions):
                if i:
                    if i == steps // 2:
                        s.submit_event(s.next_event_id(), "prompt", {"text": "a snow maze"})
                    if eager.spec.camera is not None and i % 5 == 1:  # a camera turn at times
                        s.submit_event(s.next_event_id(), "camera", {"mode": "velocity", "yaw": 0.05 * (i % 3 - 1),
                                                                     "pitch": 0.01})
                    t = time.perf_counter()
                    frames.append(s.step(action=plan[i - 1]).frames)
                    times[j].append((time.perf_counter() - t) * 1000)
            (ka, va), (kb, vb) = (last_chunk_kv(wd, s) for wd, s in zip(worlds, sessions, strict=True))
            diffs.append(max(float((ka - kb).abs().max()), float((va - vb).abs().max())))
            if frames:
                frame_diff = max(frame_diff, int(np.abs(frames[0].astype(np.int16) - frames[1]).max()))
    finally:
        for wd in worlds:
            wd.close()
    return {"steps": steps, "kv_max_diff": max(diffs), "kv_max_diff_by_step": [float(f"{d:.3g}") for d in diffs],
            "frame_max_diff_levels": frame_diff, "state_keys_differ": keys[0] != keys[1],
            "compiled_first_step_ms": round(times[1][0], 1),
            "eager_step_ms_p50": round(float(np.median(times[0][1:])), 3),
            "compiled_step_ms_p50": round(float(np.median(times[1][1:])), 3)}
