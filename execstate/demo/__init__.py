"""``execstate demo`` (``make demo``): a tour of the three workloads on the embedded models.

1. ``r3``: an MoE RL rollout with Rollout Routing Replay under prefix caching (``demo/r3.py``).
2. ``world``: a world-model session steered by a key, checkpointed and rolled back, compared with
   the renderer that made its data; a PNG strip (``demo/world.py``).
3. ``agent``: a full-duplex agent conversation with a delegation and a barge-in, as a timeline
   (``demo/agent.py``).

Each part prints what it shows and its own checks; the exit status is 0 only if every part passed.
"""

from __future__ import annotations

import time
from pathlib import Path

from execstate.paths import cache_dir

PARTS = ("r3", "world", "agent")


def run_demo(model: str = "smollm2-moe", parts: tuple[str, ...] = PARTS, out_dir: Path | None = None) -> int:
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown demo part(s) {unknown}; choose from {', '.join(PARTS)}")
    out_dir = out_dir or cache_dir() / "demo"
    t0 = time.perf_counter()
    results: dict[str, bool] = {}
    for n, part in enumerate(parts, 1):
        print(f"\n=== {n}/{len(parts)} {_TITLES[part]} ===")
        if part == "r3":
            from execstate.demo.r3 import run_r3

            results[part] = run_r3(model)
        elif part == "world":
            from execstate.demo.world import run_world

            results[part] = run_world(out_dir)
        else:
            from execstate.demo.agent import run_agent

            results[part] = run_agent()
    ok = all(results.values())
    summary = ", ".join(f"{p} {'ok' if r else 'FAILED'}" for p, r in results.items())
    print(f"\ndemo {'PASSED' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s ({summary})")
    return 0 if ok else 1


_TITLES = {
    "r3": "MoE RL rollout with Rollout Routing Replay (R3) under prefix caching",
    "world": "a realtime world model, steered live as a session",
    "agent": "a full-duplex agent: delegation and barge-in",
}
