"""The maze world model behind the plug-in interface: the K/V contract, and the cached step equal to
the teacher-forced training forward (so what training optimises is what a session runs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from execstate.model.world.interface import KVWriter, WorldModel
from execstate.model.world.maze.model import MazeWorldModel
from execstate.model.world.maze.pose import DTHETA, PITCH_LIMIT
from execstate.model.world.sampler import denoise_chunk
from execstate.state.kv_pool import KVPool
from execstate_bench.world_tools import maze_data, maze_teacher
from tests.model.world.maze.maze_helpers import random_maze_net

F = 2


@pytest.fixture(scope="module")
def tiny_maze() -> MazeWorldModel:
    return MazeWorldModel(random_maze_net(), weights_version="tiny-maze-random")


def _pool(model: MazeWorldModel, chunks: int) -> KVPool:
    kv = model.spec.kv
    return KVPool(kv.num_layers, chunks * kv.blocks_per_chunk(16), 16, kv.num_kv_heads, kv.head_dim, kv.dtype)


def _trajectory(seed: int, chunks: int) -> maze_data.Trajectory:
    return maze_data.random_trajectory(np.random.default_rng(seed), chunks * F, F)


def _actions(model: MazeWorldModel, tr: maze_data.Trajectory, c: int):  # noqa: ANN202
    return model.make_actions(tr.keys[c * F : (c + 1) * F], tr.camera[c * F : (c + 1) * F])


def test_is_a_world_model_with_a_camera_rig(tiny_maze: MazeWorldModel) -> None:
    spec = tiny_maze.spec
    assert isinstance(tiny_maze, WorldModel)
    assert spec.frame_shape == (64, 64, 3) and spec.frames_per_chunk == F and spec.camera_dim == 4
    assert spec.camera is not None and dict(spec.camera.turn_keys) == {"turn_left": -4 * DTHETA,
                                                                        "turn_right": 4 * DTHETA}
    assert spec.keys == ("none", "forward", "back", "left", "right", "turn_left", "turn_right")
    assert spec.kv.tokens_per_frame == 16


def test_bad_actions_and_frames_are_refused(tiny_maze: MazeWorldModel) -> None:
    with pytest.raises(ValueError, match="keys in"):
        tiny_maze.make_actions([0, 7])
    with pytest.raises(ValueError, match="4 finite numbers"):
        tiny_maze.make_actions([0, 0], [[0.0, 0.0, 0.0, float("nan")]] * 2)
    with pytest.raises(ValueError, match="pitch"):
        tiny_maze.make_actions([0, 0], [[0.0, PITCH_LIMIT * 2, 0.0, 0.0]] * 2)
    with pytest.raises(ValueError, match="uint8"):
        tiny_maze.encode_frames(np.zeros((2, 48, 48, 3), np.uint8))
    frames = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    assert np.array_equal(tiny_maze.decode(tiny_maze.encode_frames(frames)), frames)  # exact round trip


def test_denoise_writes_nothing_and_commit_writes_only_its_slots(tiny_maze: MazeWorldModel) -> None:
    tr = _trajectory(1, 3)
    pool = _pool(tiny_maze, 4)
    prompt = tiny_maze.encode_prompt(tr.prompt, 0)
    carry = tiny_maze.initial_carry()
    w0 = KVWriter(pool, [0, 1], tiny_maze.spec.kv)
    carry = tiny_maze.commit(tiny_maze.encode_frames(tr.frames(0, F)), _actions(tiny_maze, tr, 0), prompt,
                             tiny_maze.gather_context(pool, []), carry, w0)
    before = (pool.k.clone(), pool.v.clone())
    ctx = tiny_maze.gather_context(pool, [(0, 1)])
    noise = torch.randn((1, *tiny_maze.spec.chunk_latent_shape))
    a = denoise_chunk(tiny_maze, noise, _actions(tiny_maze, tr, 1), prompt, ctx, carry)
    b = denoise_chunk(tiny_maze, noise, _actions(tiny_maze, tr, 1), prompt, ctx, carry)
    assert torch.equal(pool.k, before[0]) and torch.equal(pool.v, before[1]) and torch.equal(a, b)
    tiny_maze.commit(a, _actions(tiny_maze, tr, 1), prompt, ctx, carry, KVWriter(pool, [4, 5], tiny_maze.spec.kv))
    changed = (pool.k != before[0]).any(dim=(0, 2, 3)).nonzero().flatten()
    assert changed.min() >= 4 * 16 and changed.max() < 6 * 16  # blocks 4 and 5 only
    assert torch.equal(pool.k[:, : 2 * 16], before[0][:, : 2 * 16])


def test_context_depends_only_on_the_blocks_bytes_and_order(tiny_maze: MazeWorldModel) -> None:
    tr = _trajectory(2, 2)
    prompt = tiny_maze.encode_prompt(tr.prompt, 0)
    outs = []
    for ids in ([0, 1], [6, 3]):
        pool = _pool(tiny_maze, 4)
        tiny_maze.commit(tiny_maze.encode_frames(tr.frames(0, F)), _actions(tiny_maze, tr, 0), prompt,
                         tiny_maze.gather_context(pool, []), tiny_maze.initial_carry(),
                         KVWriter(pool, ids, tiny_maze.spec.kv))
        ctx = tiny_maze.gather_context(pool, [tuple(ids)])
        outs.append(tiny_maze.denoise_step(torch.zeros(tiny_maze.spec.chunk_latent_shape), 0.0,
                                           _actions(tiny_maze, tr, 1), prompt, ctx,
                                           tiny_maze.encode_frames(tr.frames(0, F))[-1]))
    assert torch.equal(outs[0], outs[1])


def test_turning_back_reads_the_same_world_angle() -> None:
    """Keys are stored rotated by their world angle: a whole turn is the identity rotation."""
    from execstate.model.world.maze import positions

    k = torch.randn(5, 16, 2, 16)
    ang = torch.rand(16) * 6
    c1, s1 = positions.angle_tables(ang, 16, 2)
    c2, s2 = positions.angle_tables(ang + 2 * np.pi, 16, 2)
    from execstate.model.world.rope import rotate

    assert torch.allclose(rotate(k, c1, s1), rotate(k, c2, s2), atol=1e-5)


def test_cached_steps_equal_the_teacher_forced_forward(tiny_maze: MazeWorldModel) -> None:
    """Chunk by chunk through the pool (commit each true chunk, predict the next from the cached
    context) gives what maze_teacher.predict computes for the whole window at once."""
    n = 4
    tr = _trajectory(3, n)
    cfg = tiny_maze.cfg
    batch = maze_teacher.window_batch([tr], [1], n - 1, cfg)
    with torch.no_grad():
        want = maze_teacher.predict(tiny_maze.net, batch)[0]  # chunks 1 .. n-1
    pool = _pool(tiny_maze, n)
    prompt = tiny_maze.encode_prompt(tr.prompt, 0)
    carry = tiny_maze.initial_carry()
    table: list[tuple[int, ...]] = []
    for c in range(n):
        ctx = tiny_maze.gather_context(pool, table)
        if c:
            got = tiny_maze.denoise_step(torch.zeros(tiny_maze.spec.chunk_latent_shape), 0.0,
                                         _actions(tiny_maze, tr, c), prompt, ctx, carry)
            assert torch.allclose(got, want[c - 1].clamp(-1, 1), atol=2e-4), c
        ids = [2 * c, 2 * c + 1]
        carry = tiny_maze.commit(tiny_maze.encode_frames(tr.frames(c * F, (c + 1) * F)), _actions(tiny_maze, tr, c),
                                 prompt, ctx, carry, KVWriter(pool, ids, tiny_maze.spec.kv))
        table.append(tuple(ids))
