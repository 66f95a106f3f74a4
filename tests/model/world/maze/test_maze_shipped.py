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
import torch

from execstate.model.world.maze import layout, pose, raycast
from execstate.model.world.weights import file_sha256
from execstate.model.world_default import MAZE_SHIPPED_DIR, load_default_maze_model
from execstate.session.world.offline import World
from execstate_bench.world_tools import maze_quality, maze_state_data
from execstate_bench.world_tools.maze_metrics import psnr, read_position
from execstate_bench.world_tools.maze_script import ScriptedPlayer

# Measured on the shipped weights (fp16 storage, fp32 compute, eager); docs/world-maze.md.
MIN_PSNR_120 = 27.0  # mean PSNR over 120 steps of scripted play, scene 3 (measured 28.5 dB)
MIN_SSIM_120 = 0.73  # (measured 0.772)
MIN_TURN_GAIN_DB = 20.0  # a camera turn: the new view matches the old one shifted, not unshifted
MIN_SPIN_DB = 40.0  # after a 360-degree camera spin, the view vs the view before it (the same pose)
MAX_START_ERROR = 0.1  # cells between the located start and the renderer's start pose
MAX_MAP_ERROR = 0.03  # cells: the free-space map vs the walker's clearance near walls (measured 0.017)
MAX_STEP_MISSES = 0.02  # one step from a true pose off by > 0.01 cell (measured 0.85 %; the map before: 7.8 %)
MAX_BAND_DEPTH = 0.03  # cells a step may end inside a wall's band (the slide rule's 0.01 + the map's error; 0.015)
MAX_STATE_ERROR = 0.15  # cells between the model's walker and the true one over 300 scripted steps (measured 0.05)


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
    """The quality tool's first 120 steps: five pushes into walls, none shows a wall crossed."""
    pl = maze_quality.play(model, 120, scene_seed=3, prompt="a dungeon maze")
    r = maze_quality.report(pl, model.spec.frames_per_chunk)
    assert r["psnr_mean_db"] >= MIN_PSNR_120, r
    assert r["ssim_mean"] >= MIN_SSIM_120, r
    assert r["pushes"] >= 5 and r["walls_crossed_frames"] == r["walls_crossed_pushes"] == 0, r


def test_the_free_space_map_is_the_walkers_clearance(model) -> None:  # noqa: ANN001
    maze = layout.generate(3)
    xz = np.random.default_rng(12).uniform(0.0, layout.GRID, size=(20000, 2)).astype(np.float32)
    truth = maze_state_data.clearance(maze, xz)
    with torch.no_grad():
        learnt = model.net.motion.free_logit(torch.from_numpy(xz[:, 0]), torch.from_numpy(xz[:, 1])).numpy()
    near = np.abs(truth) < 0.1
    assert near.sum() > 1000 and float(np.abs(learnt - truth)[near].max()) < MAX_MAP_ERROR
    assert float(((learnt > 0) == (truth > 0)).mean()) > 0.999


def test_one_step_from_a_true_pose_is_the_physics_step(model) -> None:  # noqa: ANN001
    """Walks of the training policy (a seed training did not use): one step of the model's motion
    from each true pose lands where the physics put the walker, but on a few frames, and never
    deeper into a wall's band than the slide rule lets it."""
    maze = layout.generate(3)
    w = maze_state_data.walks(maze, np.random.default_rng(11), 256, 64)
    keys, yaw, xz = (torch.from_numpy(a) for a in (w.keys, w.yaw, w.xz))
    with torch.no_grad():
        pos, _ = model.net.motion.walk(xz[:, :-1, 0].reshape(-1), xz[:, :-1, 1].reshape(-1), yaw.reshape(-1, 1),
                                       keys.reshape(-1, 1))
    err = (pos[:, 0] - xz[:, 1:].reshape(-1, 2)).norm(dim=-1)
    assert float((err > 0.01).to(torch.float32).mean()) < MAX_STEP_MISSES
    assert float(maze_state_data.clearance(maze, pos[:, 0].numpy()).min()) > -MAX_BAND_DEPTH


def test_the_walker_stays_with_the_true_one_through_300_scripted_steps(model) -> None:  # noqa: ANN001
    """The quality tool's script (11 pushes into walls in 300 steps), the session's carried position
    against the physics' walker after every chunk: never through a wall, never far from it (the
    motion before the clearance map lost it through a wall at step 290)."""
    maze = layout.generate(3)
    start = pose.start_pose(maze)
    player = ScriptedPlayer(maze, 0)
    p, rel_yaw, moved, held, pushes = start, 0.0, True, None, 0
    with World(model, max_sessions=1) as world:
        s = world.open_session(prompt="a dungeon maze", scene_seed=3)
        state = world.sessions.runtime(s.session_id).state
        for _ in range(300):
            c = player.next(p, rel_yaw, moved)
            want = None if c.key == "none" else c.key
            if want != held:
                s.submit_event(s.next_event_id(), "key",
                               {"key": held if want is None else want, "down": want is not None})
                held = want
            if c.camera is not None:
                s.submit_event(s.next_event_id(), "camera", c.camera)
            r = s.step()
            moved = False
            for key, (yaw_rel, pitch) in zip(r.keys, r.camera, strict=True):
                q = pose.step(maze, p, key, start.yaw + yaw_rel, pitch)
                moved |= math.hypot(q.x - p.x, q.z - p.z) > 0.01
                pushes += key in ("forward", "back", "left", "right") and (q.x, q.z) == (p.x, p.z)
                p, rel_yaw = q, yaw_rel
            x, z = state.carry.tolist()[:2]
            walker = pose.Pose(x, z, p.yaw)
            assert not pose.crossed_wall(maze, p, walker), (p, walker)
            assert math.hypot(x - p.x, z - p.z) < MAX_STATE_ERROR, (p, walker)
    assert pushes > 50


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
