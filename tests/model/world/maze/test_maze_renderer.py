"""The maze world (the ground truth of the first-person model): layout, physics and the raycaster."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.model.world.maze import layout, pose, raycast
from execstate.model.world.maze.textures import THEMES, theme_for_prompt

SEEDS = range(12)


def _open_cells(m: layout.Maze) -> set[tuple[int, int]]:
    return {(int(r), int(c)) for r, c in np.argwhere(m.walls == 0)}


@pytest.mark.parametrize("seed", SEEDS)
def test_layout_is_a_closed_connected_maze(seed: int) -> None:
    m = layout.generate(seed)
    assert m.walls.shape == (layout.GRID, layout.GRID)
    assert (m.walls[0] > 0).all() and (m.walls[-1] > 0).all() and (m.walls[:, 0] > 0).all() and (
        m.walls[:, -1] > 0).all()
    assert set(np.unique(m.walls)) <= set(range(len(layout.WALL_KINDS) + 1))
    cells = _open_cells(m)
    start = (int(m.start_z), int(m.start_x))
    assert start in cells and not pose.blocked(m, m.start_x, m.start_z)
    seen, todo = {start}, deque([start])  # every open cell is reachable from the start
    while todo:
        r, c = todo.popleft()
        for n in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if n in cells and n not in seen:
                seen.add(n)
                todo.append(n)
    assert seen == cells
    assert 4 <= len(m.objects) <= 7
    assert all((int(o.z), int(o.x)) in cells for o in m.objects)
    ahead = (start[0] + round(math.sin(m.start_yaw)), start[1] + round(math.cos(m.start_yaw)))
    assert ahead in cells  # the walker starts facing along an open corridor


def test_same_seed_same_maze_and_frames() -> None:
    a, b, c = layout.generate(7), layout.generate(7), layout.generate(8)
    assert np.array_equal(a.walls, b.walls) and a.objects == b.objects
    assert not np.array_equal(a.walls, c.walls)
    fa = raycast.render(a, pose.start_pose(a), "ice")
    assert np.array_equal(fa, raycast.render(b, pose.start_pose(b), "ice"))
    assert fa.shape == (raycast.SIZE, raycast.SIZE, 3) and fa.dtype == np.uint8


def test_bad_seeds_and_themes_are_refused() -> None:
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="non-negative int"):
            layout.generate(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown theme"):
        raycast.render(layout.generate(0), pose.start_pose(layout.generate(0)), "mars")
    assert theme_for_prompt("An ICE maze, please") == "ice" and theme_for_prompt("whatever") == "dungeon"


@pytest.mark.parametrize(("seed", "k"), [(1, 1), (2, 4), (3, 13), (4, -6)])
def test_turning_by_whole_columns_shifts_the_frame(seed: int, k: int) -> None:
    """The cylindrical camera: a turn of k columns' angle is a k-column shift, pixel for pixel."""
    m = layout.generate(seed)
    p = pose.start_pose(m)
    a = raycast.render(m, p, "dungeon")
    b = raycast.render(m, pose.Pose(p.x, p.z, p.yaw + k * pose.DTHETA, 0.0), "dungeon")
    if k > 0:
        assert np.array_equal(a[:, k:], b[:, :-k])
    else:
        assert np.array_equal(a[:, :k], b[:, -k:])
    assert not np.array_equal(a, b)


def test_pitch_shifts_the_rows() -> None:
    m = layout.generate(6)
    p = pose.start_pose(m)
    a = raycast.render(m, p, "jungle")
    for k in (2, 9):
        up = raycast.render(m, pose.Pose(p.x, p.z, p.yaw, k * pose.DTHETA), "jungle")
        assert np.array_equal(a[:-k], up[k:])  # looking up moves the picture down


def test_a_wall_ahead_fills_the_view_and_stops_the_walker() -> None:
    m = layout.generate(3)
    p = pose.start_pose(m)
    for _ in range(200):
        p = pose.step(m, p, "forward", p.yaw, 0.0)
    row, col = int(p.z + math.sin(p.yaw) * 0.5), int(p.x + math.cos(p.yaw) * 0.5)
    assert m.is_wall(row, col) or pose.blocked(m, p.x + math.cos(p.yaw) * 0.1, p.z + math.sin(p.yaw) * 0.1)
    dist, _, _, _ = raycast.cast(m, p.x, p.z, np.array([p.yaw]))
    assert dist[0] >= pose.RADIUS - 1e-9  # stopped at its radius, not inside
    frame = raycast.render(m, p, "dungeon")
    centre = frame[:, 24:40].astype(int)
    ceiling = np.asarray(THEMES["dungeon"].ceiling) * 255
    assert np.abs(centre[0].mean(axis=0) - ceiling).max() > 10  # the wall reaches the top row


def test_objects_are_drawn_in_front_of_walls() -> None:
    m = layout.generate(2)
    o = m.objects[0]
    for yaw in np.linspace(0, 2 * math.pi, 16, endpoint=False):  # stand next to the object, facing it
        x, z = o.x - 0.8 * math.cos(yaw), o.z - 0.8 * math.sin(yaw)
        if not pose.blocked(m, x, z):
            break
    p = pose.Pose(x, z, float(yaw), 0.0)
    with_obj = raycast.render(m, p, "dungeon")
    bare = layout.Maze(m.seed, m.walls, (), m.start_x, m.start_z, m.start_yaw)
    without = raycast.render(bare, p, "dungeon")
    diff = (with_obj != without).any(axis=-1)
    assert diff[:, 24:40].mean() > 0.1  # the object covers the middle of the view
    assert not diff[:, :4].any()  # and nothing at the edges (it is 0.6 wide at 0.8 away)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), keys=st.lists(st.sampled_from(pose.KEYS), min_size=20, max_size=120),
       turn=st.floats(-0.3, 0.3))
def test_the_walker_never_enters_a_wall(seed: int, keys: list[str], turn: float) -> None:
    m = layout.generate(seed)
    p = pose.start_pose(m)
    yaw = p.yaw
    for i, key in enumerate(keys):
        yaw += pose.TURN_KEYS.get(key, 0.0) + (turn if i % 7 == 0 else 0.0)
        q = pose.step(m, p, key, yaw, 0.0)
        assert not pose.blocked(m, q.x, q.z)
        assert not pose.crossed_wall(m, p, q)
        if key in ("forward", "back", "left", "right"):
            assert math.hypot(q.x - p.x, q.z - p.z) <= pose.MOVE_SPEED * math.sqrt(2) + 1e-9
        else:
            assert (q.x, q.z) == (p.x, p.z)
        p = q


def test_crossed_wall_sees_a_jump_through_a_wall() -> None:
    m = layout.generate(0)
    r, c = next((int(r), int(c)) for r, c in np.argwhere(m.walls[1:-1, 1:-1] > 0) + 1
                if m.walls[r, c - 1] == 0 and m.walls[r, c + 1] == 0)
    a, b = pose.Pose(c - 0.5, r + 0.5, 0.0), pose.Pose(c + 1.5, r + 0.5, 0.0)
    assert pose.crossed_wall(m, a, b) and not pose.crossed_wall(m, a, a)
    with pytest.raises(ValueError, match="key must be one of"):
        pose.step(m, a, "jump", 0.0, 0.0)
