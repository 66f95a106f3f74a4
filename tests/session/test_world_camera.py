"""A world session's camera (models with a rig): events in vLLM-Omni's two modes, integrated at
chunk boundaries, composed with the held key, acknowledged with the chunk that applies them, and
part of the state that checkpoints, migration and hibernation carry (bit for bit)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.model.world.interface import CameraRig
from execstate.model.world.maze.model import MazeWorldModel
from execstate.model.world.maze.pose import DTHETA, PITCH_LIMIT, TURN_RATE
from execstate.session.runtime.events import SessionEventError
from execstate.session.world.camera import CameraCommand, CameraState, advance, parse_command
from execstate.session.world.offline import World
from tests.model.world.maze.maze_helpers import random_maze_net

RIG = CameraRig((("turn_left", -TURN_RATE), ("turn_right", TURN_RATE)), PITCH_LIMIT)
NONE2 = ("none", "none")


def _yaws(chunk) -> list[float]:  # noqa: ANN001
    return [r[0] for r in chunk.rows]


def test_velocity_turns_every_frame_until_replaced_and_composes_with_a_turn_key() -> None:
    c = advance(CameraState(), (5, CameraCommand("velocity", 0.1, 0.0)), NONE2, RIG)
    assert _yaws(c) == pytest.approx([0.1, 0.2]) and c.active == (5,) and c.completed == ()
    c = advance(c.state, None, ("turn_right", "turn_right"), RIG)  # still turning, plus the key
    assert _yaws(c) == pytest.approx([0.3 + TURN_RATE, 0.4 + 2 * TURN_RATE])
    assert [r[2] for r in c.rows] == pytest.approx([0.1 + TURN_RATE] * 2)
    c = advance(c.state, (6, CameraCommand("velocity", 0.0, 0.0)), NONE2, RIG)  # stop: 5 replaced, 6 done
    assert c.completed == (5, 6) and c.active == () and c.state.motion is None
    assert _yaws(c) == pytest.approx([0.4 + 2 * TURN_RATE] * 2)


def test_a_target_is_interpolated_over_transition_chunks_and_completes_there() -> None:
    c = advance(CameraState(), (1, CameraCommand("target", 0.8, 0.2, 0, 2)), NONE2, RIG)
    assert _yaws(c) == pytest.approx([0.2, 0.4]) and c.active == (1,)
    c = advance(c.state, None, NONE2, RIG)
    assert _yaws(c) == pytest.approx([0.6, 0.8]) and c.completed == (1,) and c.active == ()
    assert c.rows[-1][1] == pytest.approx(0.2)
    snap = advance(CameraState(), (2, CameraCommand("target", -0.5, 0.0, 1, 0)), NONE2, RIG)
    assert _yaws(snap) == pytest.approx([0.0, -0.5]) and snap.completed == (2,)  # at_frame 1, at once


def test_a_target_goes_the_short_way_round_and_pitch_is_clamped() -> None:
    start = CameraState(yaw=3.0)
    c = advance(start, (1, CameraCommand("target", -3.0, 9.0, 0, 0)), NONE2, RIG)
    assert c.rows[0][0] == pytest.approx(3.0 + (2 * math.pi - 6.0))  # through pi, not back through 0
    assert c.rows[0][1] == pytest.approx(PITCH_LIMIT)


def test_a_held_turn_key_adds_to_a_target_and_a_relative_target_turns_by() -> None:
    c = advance(CameraState(yaw=1.0), (1, CameraCommand("target", 1.4, 0.0, 0, 1)), ("turn_right",) * 2, RIG)
    assert _yaws(c) == pytest.approx([1.2 + TURN_RATE, 1.4 + 2 * TURN_RATE]) and c.completed == (1,)
    r = advance(CameraState(yaw=5.0), (2, CameraCommand("target", 7.0, 0.1, 0, 2, relative=True)), NONE2, RIG)
    assert _yaws(r) == pytest.approx([6.75, 8.5]) and r.active == (2,)  # by 7 rad, not the short way to 7
    r = advance(r.state, None, NONE2, RIG)
    assert r.rows[-1][:2] == pytest.approx((12.0, 0.1)) and r.completed == (2,)
    with pytest.raises(ValueError, match="apply to a target"):
        parse_command({"mode": "velocity", "yaw": 0.1, "relative": True}, 2)


def test_at_frame_keeps_the_motion_in_progress_before_it() -> None:
    moving = advance(CameraState(), (1, CameraCommand("velocity", 0.1, 0.0)), NONE2, RIG).state
    c = advance(moving, (2, CameraCommand("velocity", -0.1, 0.0, at_frame=1)), NONE2, RIG)
    assert _yaws(c) == pytest.approx([0.3, 0.2]) and c.completed == (1,) and c.active == (2,)


@pytest.mark.parametrize(("data", "msg"), [
    ({"mode": "orbit"}, "mode"), ({"mode": "velocity", "yaw": 9.0}, "within"),
    ({"mode": "target", "yaw": float("inf")}, "finite"), ({"mode": "target", "at_frame": 2}, "at_frame"),
    ({"mode": "target", "transition_chunks": -1}, "transition_chunks"),
    ({"mode": "velocity", "transition_chunks": 1}, "target, not a velocity"), ({"yaw": 1.0}, "camera data"),
    ({"mode": "target", "roll": 1.0}, "camera data"), ([1, 2], "camera data")])
def test_bad_commands_are_refused(data: object, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        parse_command(data, 2)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.none() | st.tuples(st.sampled_from(["velocity", "target"]), st.floats(-1.5, 1.5),
                                                       st.floats(-0.5, 0.5), st.integers(0, 1), st.integers(0, 3)),
                                st.sampled_from(["none", "turn_left", "turn_right", "forward"])), max_size=12))
def test_rows_add_up_and_every_event_ends_once(steps: list) -> None:  # noqa: ANN001
    state, eid, ended, seen = CameraState(), 0, set(), set()
    for cmd, key in steps:
        command = None
        if cmd is not None:
            mode, yaw, pitch, at, tc = cmd
            eid += 1
            command = (eid, parse_command({"mode": mode, "yaw": yaw, "pitch": pitch, "at_frame": at,
                                           **({"transition_chunks": tc, "relative": tc % 2 == 0}
                                              if mode == "target" else {})}, 2))
            seen.add(eid)
        c = advance(state, command, (key, key), RIG)
        prev_yaw, prev_pitch = state.yaw, state.pitch
        for yaw, pitch, dyaw, dpitch in c.rows:
            assert dyaw == pytest.approx(yaw - prev_yaw) and dpitch == pytest.approx(pitch - prev_pitch)
            assert abs(pitch) <= PITCH_LIMIT + 1e-12
            prev_yaw, prev_pitch = yaw, pitch
        assert not ended & set(c.completed)  # completed once
        assert not set(c.active) & set(c.completed)
        ended |= set(c.completed)
        state = c.state
    assert ended | {m.event_id for m in [state.motion] if m} == seen


# -- the session ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def maze_world() -> World:
    w = World(MazeWorldModel(random_maze_net(), "tiny-maze-random"), max_sessions=4)
    yield w
    w.close()


def test_a_camera_event_is_applied_at_the_boundary_and_acknowledged(maze_world: World) -> None:
    s = maze_world.open_session(prompt="an ice maze", scene_seed=4)
    r0 = s.step()
    assert r0.camera == ((0.0, 0.0), (0.0, 0.0))
    s.submit_event(1, "camera", {"mode": "velocity", "yaw": 3 * DTHETA, "pitch": 0.0})
    s.submit_event(2, "key", {"key": "turn_left", "down": True})
    r1 = s.step()
    assert r1.events == {"started": [1, 2], "active": [1, 2], "completed": []}
    assert [y for y, _ in r1.camera] == pytest.approx([-DTHETA, -2 * DTHETA])  # 3 - 4 columns per frame
    s.submit_event(3, "camera", {"mode": "target", "yaw": 0.0, "pitch": 0.1, "transition_chunks": 0})
    r2 = s.step()
    assert r2.events["completed"] == [1, 3] and r2.events["active"] == [2]
    assert r2.camera[0] == pytest.approx((-TURN_RATE, 0.1))  # the target, then the held key's turn
    with pytest.raises(SessionEventError, match="camera mode"):
        s.submit_event(4, "camera", {"mode": "dolly"})
    s.close()


def test_rollback_replays_the_camera_bit_for_bit(maze_world: World) -> None:
    s = maze_world.open_session(prompt="a jungle maze", scene_seed=2, seed=3)
    s.submit_event(0, "camera", {"mode": "velocity", "yaw": 0.05, "pitch": 0.01})
    s.step()
    cp = s.checkpoint()
    s.submit_event(1, "camera", {"mode": "target", "yaw": -1.0, "pitch": 0.0, "transition_chunks": 2})
    first = [s.step() for _ in range(3)]
    s.rollback(cp)
    s.submit_event(1, "camera", {"mode": "target", "yaw": -1.0, "pitch": 0.0, "transition_chunks": 2})
    again = [s.step() for _ in range(3)]
    assert [r.frames_sha256 for r in first] == [r.frames_sha256 for r in again]
    assert [r.camera for r in first] == [r.camera for r in again]
    s.close()


@pytest.mark.parametrize("how", ["hibernate", "migrate"])
def test_hibernation_and_migration_carry_the_camera(maze_world: World, how: str) -> None:
    def run(moved: bool) -> list[str]:
        s = maze_world.open_session(prompt="a dungeon", scene_seed=1, seed=5)
        s.submit_event(0, "camera", {"mode": "target", "yaw": 0.7, "pitch": -0.05, "transition_chunks": 3})
        s.step()
        if moved and how == "hibernate":
            s.hibernate()
        elif moved:
            other = World(maze_world.model, max_sessions=2)
            s = s.migrate(other)
        out = [s.step() for _ in range(3)]
        assert out[1].events["completed"] == [0]  # the target's third chunk is still the same one
        s.close()
        return [r.frames_sha256 for r in out] + [repr(r.camera) for r in out]

    assert run(True) == run(False)
