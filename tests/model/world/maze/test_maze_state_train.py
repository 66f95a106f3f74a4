"""The maze state model's training (``benchmarks/execstate_bench/world_tools/maze_state_train.py``):
the clearance its free-space map learns is the physics' collision test, and the motion stage learns
a map that stops the walker where the physics does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from execstate.model.world.maze import layout, pose
from execstate.model.world.maze.state.config import StateModelConfig
from execstate_bench.world_tools import maze_state_data
from execstate_bench.world_tools.maze_state_train import TrainConfig, Trainer


@pytest.mark.parametrize("seed", [3, 8])
def test_the_clearance_is_negative_exactly_where_the_physics_blocks(seed: int) -> None:
    maze = layout.generate(seed)
    xz = np.random.default_rng(seed).uniform(0.0, layout.GRID, size=(4000, 2)).astype(np.float32)
    c = maze_state_data.clearance(maze, xz)
    blocked = np.array([pose.blocked(maze, float(x), float(z)) for x, z in xz])
    assert blocked.any() and not blocked.all()
    assert np.array_equal(c < 0, blocked)
    # a wall cell's inside: the disc overlaps it by its radius; a cell's centre next to walls: 0.25 clear
    inside = [(x, z) for x, z in xz if maze.is_wall(int(z), int(x))]
    assert np.allclose(maze_state_data.clearance(maze, np.asarray(inside)), -pose.RADIUS)
    free_centres = [(c + 0.5, r + 0.5) for r in range(layout.GRID) for c in range(layout.GRID)
                    if not maze.walls[r, c] and maze.walls[r, c + 1]
                    and all((o.x - c - 0.5) ** 2 + (o.z - r - 0.5) ** 2 > 1.0 for o in maze.objects)]
    assert free_centres
    assert np.allclose(maze_state_data.clearance(maze, np.asarray(free_centres)), 0.5 - pose.RADIUS)


def test_the_motion_stage_stops_the_walker_where_the_physics_does(tmp_path: Path) -> None:
    """The recipe's motion stage (with few walks and no view training): the learnt steps are the keys'
    moves, and one step from a walk's true pose lands where the physics put the walker on all but a
    few frames (the shipped motion: 0.6-0.9 % of frames off by more than 0.01 cell)."""
    torch.set_num_threads(1)
    mc = StateModelConfig(occupancy_per_cell=2, appearance_per_cell=2, appearance_channels=4, surface_bins=4,
                          ray_samples=32, theme_dim=4, mlp_hidden=16)
    tc = TrainConfig(views=2, walks=96, walk_frames=32, view_steps=0, motion_batch=32, checkpoint_every=10_000)
    trainer = Trainer(tc, mc, tmp_path)
    before = trainer.one_step_error()
    trainer.run(resume=False)
    steps = trainer.net.motion.steps.detach()
    assert torch.allclose(steps[1], torch.tensor([pose.MOVE_SPEED, 0.0]), atol=2e-3)
    assert torch.allclose(steps[4], torch.tensor([0.0, pose.STRAFE_SPEED]), atol=2e-3)
    after = trainer.one_step_error()
    assert before > 0.5 and after < 0.03, (before, after)
    assert json.loads(json.dumps(trainer.losses))["motion"][-1] < trainer.losses["motion"][0] / 100
