"""The procedural world (the ground truth): determinism and physics."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.model.world import renderer as r


def _open_room(agent: tuple[int, int], movers: tuple[r.Mover, ...] = ()) -> r.SceneState:
    walls = np.zeros((r.GRID, r.GRID), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    return r.SceneState(walls, agent, movers, "meadow")


def test_same_seed_same_world_and_frames() -> None:
    keys = r.random_actions(np.random.default_rng(5), 40)
    _, a = r.trajectory(r.initial_state(7, "night"), keys)
    _, b = r.trajectory(r.initial_state(7, "night"), keys)
    assert np.array_equal(a, b)
    _, c = r.trajectory(r.initial_state(8, "night"), keys)
    assert not np.array_equal(a, c)
    # golden: the world is part of the model's contract (training data and quality numbers)
    assert hashlib.sha256(a.tobytes()).hexdigest()[:16] == GOLDEN_NIGHT_7


GOLDEN_NIGHT_7 = "aecbe1162bd06451"


@pytest.mark.parametrize(("key", "delta"), [(r.UP, (-1, 0)), (r.DOWN, (1, 0)), (r.LEFT, (0, -1)),
                                            (r.RIGHT, (0, 1)), (r.NONE, (0, 0))])
def test_keys_move_the_agent_one_cell(key: int, delta: tuple[int, int]) -> None:
    s = r.step(_open_room((7, 7)), key)
    assert s.agent == (7 + delta[0], 7 + delta[1])
    assert s.t == 1


@pytest.mark.parametrize(("start", "key"), [((1, 5), r.UP), ((r.GRID - 2, 5), r.DOWN), ((5, 1), r.LEFT),
                                            ((5, r.GRID - 2), r.RIGHT)])
def test_walls_block_the_agent(start: tuple[int, int], key: int) -> None:
    s = _open_room(start)
    assert r.step(s, key).agent == start
    walls = np.array(s.walls)
    walls[7, 7] = True  # an inner wall cell right of the agent
    inner = r.SceneState(walls, (7, 6), (), "meadow")
    assert r.step(inner, r.RIGHT).agent == (7, 6)
    assert r.step(inner, r.LEFT).agent == (7, 5)


def test_movers_patrol_and_turn_at_walls() -> None:
    s = _open_room((8, 8), (r.Mover(3, r.GRID - 3, 0, 1), r.Mover(1, 3, -1, 0)))
    s1 = r.step(s, r.NONE)
    assert s1.movers[0] == r.Mover(3, r.GRID - 2, 0, 1)  # moved into the last free column
    assert s1.movers[1] == r.Mover(2, 3, 1, 0)  # blocked above: turned and moved down
    s2 = r.step(s1, r.NONE)
    assert s2.movers[0] == r.Mover(3, r.GRID - 3, 0, -1)


def test_render_colours_and_draw_order() -> None:
    s = _open_room((4, 4), (r.Mover(4, 4, 0, 1), r.Mover(4, 5, 0, 1)))  # mover 0 under the agent
    f = r.render(s)
    assert f.shape == (r.FRAME, r.FRAME, 3) and f.dtype == np.uint8
    floor, wall = r.THEMES["meadow"]
    assert tuple(f[0, 0]) == wall and tuple(f[5, 5]) == floor
    assert (f[16:20, 16:20] == r.AGENT_RGB).all()  # agent on top
    assert (f[16:20, 20:24] == r.MOVER_RGB[1]).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), theme=st.sampled_from(r.THEME_NAMES))
def test_locate_agent_recovers_the_true_centre(seed: int, theme: str) -> None:
    s = r.initial_state(seed, theme)
    for key in r.random_actions(np.random.default_rng(seed), 6):
        s = r.step(s, int(key))
        assert r.locate_agent(r.render(s)) == r.agent_center(s)
    assert not s.walls[s.agent]


def test_locate_agent_none_without_agent_colour() -> None:
    assert r.locate_agent(np.zeros((r.FRAME, r.FRAME, 3), np.uint8)) is None


def test_theme_for_prompt() -> None:
    assert r.theme_for_prompt("A Snowy maze") == "meadow"  # whole words only
    assert r.theme_for_prompt("a maze in the snow, at night") == "snow"  # first theme word wins
    assert r.theme_for_prompt("") == r.DEFAULT_THEME
    with pytest.raises(ValueError, match="unknown theme"):
        r.initial_state(0, "jungle")


def test_trajectory_convention_and_bad_action() -> None:
    s0 = r.initial_state(1)
    keys = np.array([r.RIGHT, r.LEFT, r.LEFT])
    states, frames = r.trajectory(s0, keys)
    assert states[0] is s0 and len(frames) == 3  # keys[0] is ignored: frame 0 is the start
    assert states[1] == r.step(s0, r.LEFT)
    with pytest.raises(ValueError, match="action"):
        r.step(s0, 5)


def test_random_actions_hold_keys() -> None:
    keys = r.random_actions(np.random.default_rng(0), 4000)
    assert set(np.unique(keys)) == set(range(5))
    changes = int((keys[1:] != keys[:-1]).sum())
    assert 4000 / 8 < changes < 4000 / 2  # held for 1-8 frames (mean 4.5, same key twice merges)
