"""The shipped maze model (``execstate/model/world/maze/shipped``: the state model of maze 3) against
its raycaster, in seconds: thresholds are the measured values on fixed seeds with a margin
(docs/world-maze.md has the full measurements, ``python -m execstate_bench.world_tools.maze_quality``).
They fail when the weights stop seeing the maze, lose the walker, ignore the camera, walk through
walls or no longer load as the runtime loads them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from execstate.model.world.maze import layout, pose, raycast
from execstate.model.world.weights import file_sha256
from execstate.model.world_default import MAZE_SHIPPED_DIR, load_default_maze_model
from execstate.session.world.offline import World
from execstate_bench.world_tools import maze_quality
from execstate_bench.world_tools.maze_metrics import psnr, read_position

# Measured on the shipped weights (fp16 storage, fp32 compute, eager); docs/world-maze.md.
MIN_PSNR_40 = 27.5  # mean PSNR over 40 steps of scripted play, scene 3 (measured 29.8 dB)
MIN_SSIM_40 = 0.74  # (measured 0.797)
MIN_TURN_GAIN_DB = 20.0  # a camera turn: the new view matches the old one shifted, not unshifted
MIN_SPIN_DB = 40.0  # after a 360-degree camera spin, the view vs the view before it (the same pose)
MAX_START_ERROR = 0.1  # cells between the located start and the renderer's start pose


@pytest.fixture(scope="module")
def model():  # noqa: ANN201
    return load_default_maze_model()


def test_shipped_weights_load_with_their_sha_as_version(model) -> None:  # noqa: ANN001
    record = json.loads((MAZE_SHIPPED_DIR / "train.json").read_text())
    sha = file_sha256(MAZE_SHIPPED_DIR / "model.safetensors")
    assert model.spec.weights_version == sha == record["shipped_weights_sha256"]
    assert model.spec.model_id == "maze" and model.spec.world == "maze" and model.spec.camera is not None
    assert model.spec.scenes == (3,)
    assert (MAZE_SHIPPED_DIR / "model.safetensors").stat().st_size < 8 * 2**20


@pytest.mark.parametrize("prompt", ["a dungeon maze", "an ice maze", "a jungle maze"])
def test_a_session_is_located_at_the_start_pose(model, prompt: str) -> None:  # noqa: ANN001
    start = pose.start_pose(layout.generate(3))
    with World(model, max_sessions=1) as world:
        s = world.open_session(prompt=prompt, scene_seed=3)
        x, z, yaw, located = world.sessions.runtime(s.session_id).state.carry.tolist()
    assert located == 1.0 and math.hypot(x - start.x, z - start.z) < MAX_START_ERROR
    assert abs((yaw - start.yaw + math.pi) % (2 * math.pi) - math.pi) < 2 * pose.DTHETA


def test_scripted_play_against_the_renderer(model) -> None:  # noqa: ANN001
    pl = maze_quality.play(model, 40, scene_seed=3, prompt="a dungeon maze")
    r = maze_quality.report(pl, model.spec.frames_per_chunk)
    assert r["psnr_mean_db"] >= MIN_PSNR_40, r
    assert r["ssim_mean"] >= MIN_SSIM_40, r


def test_the_view_turns_with_the_camera(model) -> None:  # noqa: ANN001
    """Four chunks of a camera velocity of 4 columns a frame: the last frame is the first one shifted
    by 32 columns (the part that stayed in view)."""
    with World(model, max_sessions=1) as world:
        s = world.open_session(prompt="an ice maze", scene_seed=3)
        before = s.step().frames[-1]
        s.submit_event(0, "camera", {"mode": "velocity", "yaw": 4 * pose.DTHETA, "pitch": 0.0})
        after = [s.step() for _ in range(4)][-1]
    assert after.camera[-1][0] == pytest.approx(32 * pose.DTHETA)
    shifted = psnr(after.frames[-1][:, :32], before[:, 32:])
    unshifted = psnr(after.frames[-1][:, :32], before[:, :32])
    assert shifted > unshifted + MIN_TURN_GAIN_DB, (shifted, unshifted)


def test_a_full_camera_spin_comes_back_to_the_view(model) -> None:  # noqa: ANN001
    with World(model, max_sessions=1) as world:
        s = world.open_session(prompt="a jungle maze", scene_seed=3)
        for _ in range(3):
            before = s.step().frames[-1]
        s.submit_event(0, "camera", {"mode": "velocity", "yaw": 8 * pose.DTHETA, "pitch": 0.0})
        rs = [s.step() for _ in range(16)]
    assert rs[-1].camera[-1][0] == pytest.approx(2 * math.pi)
    assert psnr(rs[-1].frames[-1], before) >= MIN_SPIN_DB


def test_walking_into_a_wall_stops_at_the_wall(model) -> None:  # noqa: ANN001
    """Forward until the renderer's walker is stopped, and on: the model's view never shows the
    walker through the wall."""
    m = layout.generate(3)
    with World(model, max_sessions=1) as world:
        s = world.open_session(prompt="a dungeon maze", scene_seed=3)
        s.step()
        s.submit_event(0, "key", {"key": "forward", "down": True})
        p = pose.start_pose(m)
        blocked = 0
        for _ in range(40):
            r = s.step()
            for frame in r.frames:
                q = pose.step(m, p, "forward", p.yaw, 0.0)
                if (q.x, q.z) == (p.x, p.z):
                    blocked += 1
                    seen = read_position(frame, m, q, q.yaw, "dungeon")
                    assert not pose.crossed_wall(m, q, seen), (q, seen)
                p = q
    assert blocked >= 10
    assert np.isfinite(raycast.render(m, p, "dungeon")).all()
