"""``execstate bench world`` parts on a tiny random model (numbers are not asserted, their
invariants are: reproducibility, bounded blocks, ordering of steps to action)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "session"))
from world_helpers import TINY, tiny_world_model  # noqa: E402

from execstate.model.world.config import WorldModelConfig  # noqa: E402
from execstate_bench import world as bench  # noqa: E402
from execstate_bench.world_table import format_world_table  # noqa: E402

SCENE = WorldModelConfig(**{**TINY.to_dict(), "frame_size": 48})  # the procedural scene's frame size


def test_bench_world_parts_on_a_tiny_model(monkeypatch) -> None:
    model = tiny_world_model(SCENE)
    lat = bench.bench_latency(model, steps=8)
    assert lat["steps"] == 8 and abs(lat["frames_per_s"] - 2 * lat["chunks_per_s"]) <= 0.2
    ev = bench.bench_events(model, steps=24)
    assert ev["events"] >= 1 and 0 <= ev["steps_to_action_max"] <= 2
    cp = bench.bench_checkpoint(model, at_step=6, repeats=2)
    assert cp["rollback_reproduces_frames"] is True
    mem = bench.bench_memory(model, steps=40)
    assert mem["blocks_in_use_min_after_fill"] == mem["blocks_in_use_max_after_fill"] == 3 * mem["blocks_per_chunk"]
    report = {"model": "world", "weights_version": "tiny", "frame_shape": [48, 48, 3], "frames_per_chunk": 2,
              "threads": 1, "cpus": 2, "load_start": [0.0], "load_end": [0.0], "wall_s": 1.0,
              "latency": lat, "events": ev, "checkpoint": cp, "memory": mem}
    serve = {"runs": [{"sessions": 4, "fps_target": 16.0, "step_workers": 2, "seconds": 3.0,
                       "frames_per_s_each": [16.5, 16.4], "first_chunk_ms": [14.3, 15.6],
                       "first_generated_chunk_ms": [29.3, 40.8], "step_ms_p50": 12.0, "step_ms_p99": 34.1,
                       "behind_ms_max": 0.0, "load_before": 1.6, "load_after": 1.6}]}
    text = format_world_table(report | {"serve": serve})
    assert "event -> action p50" in text and "rollback reproduces frames bit for bit" in text
    assert "4 session(s), 16 fps, 2 step worker(s), 3 s: frames/s each [16.5, 16.4]; first chunk ms [14.3" in text
    assert np.isfinite(lat["step_ms_p50"])
