"""The maze model's numerics in sessions: K/V written in place (no temporary of pool size), and the
compiled step's K/V equal to the eager step's at every step, with camera turns (torch.compile: slow)."""

from __future__ import annotations

import pytest
from torch.profiler import ProfilerActivity, profile

from execstate.model.world.maze.model import MazeWorldModel
from execstate.session.world.offline import World
from execstate_bench.world_numerics import compare_numerics
from tests.model.world.maze.maze_helpers import random_maze_net


def _largest_allocation(model: MazeWorldModel, num_blocks: int | None) -> tuple[int, int]:
    bpc = model.spec.kv.blocks_per_chunk(model.spec.kv.tokens_per_frame)
    world = World(model, numerics=model.spec.numerics, max_sessions=1, session_blocks=12 * bpc,
                  num_blocks=num_blocks)
    s = world.open_session(scene_seed=1)
    s.submit_event(0, "camera", {"mode": "velocity", "yaw": 0.1, "pitch": 0.0})
    for _ in range(3):
        s.step(action="forward")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(3):
            s.step(action="turn_left")
    world.close()
    kv = world.sessions.store.kv
    largest = max((e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0), default=0)
    return largest, kv.k.numel() * kv.k.element_size() * 2


def _check_in_place(model: MazeWorldModel) -> None:
    bpc = model.spec.kv.blocks_per_chunk(model.spec.kv.tokens_per_frame)
    (a, small), (b, large) = _largest_allocation(model, None), _largest_allocation(model, 2048 * bpc)
    assert large > 10 * small
    assert 0 < a == b < large // 20, (a, b, large)


def test_eager_maze_step_allocates_no_pool_sized_temporary() -> None:
    _check_in_place(MazeWorldModel(random_maze_net(), "tiny-maze-random"))


@pytest.mark.slow
def test_compiled_maze_kv_matches_eager_at_every_step() -> None:
    eager = MazeWorldModel(random_maze_net(), "tiny-maze-random")
    compiled = MazeWorldModel(random_maze_net(), "tiny-maze-random", numerics="compiled")
    r = compare_numerics(eager, compiled, steps=10)
    assert r["state_keys_differ"] and len(r["kv_max_diff_by_step"]) == 11
    assert r["kv_max_diff"] < 1e-4, r
    _check_in_place(compiled)
