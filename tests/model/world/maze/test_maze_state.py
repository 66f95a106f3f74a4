"""The maze state model behind the plug-in interface, on tiny random weights: the motion (steps
turned by the yaw, walls stop it, it slides along them), the K/V contract, the frames as the view
of the carried state, a session's start located from its frames, and rollback, hibernation and
migration bit for bit. The trained weights against the renderer: ``test_maze_shipped.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from execstate.model.world.interface import KVWriter, WorldModel
from execstate.model.world.maze.pose import DTHETA
from execstate.model.world.maze.state.config import StateModelConfig
from execstate.model.world.maze.state.model import LOCATED, MazeStateModel
from execstate.model.world.maze.state.network import StateNet
from execstate.session.world.offline import World
from execstate.session.world.sessions import SessionEventError
from execstate.state.kv_pool import KVPool

F = 2
TINY = StateModelConfig(occupancy_per_cell=2, appearance_per_cell=2, appearance_channels=4, surface_bins=4,
                        ray_samples=32, theme_dim=4, mlp_hidden=16, free_per_cell=4, token_dim=8,
                        window_chunks=3, home_x=1.5, home_z=1.5, home_yaw=0.0)


def random_state_net(seed: int = 0) -> StateNet:
    torch.manual_seed(seed)
    net = StateNet(TINY)
    with torch.no_grad():  # the layers keep their seeded initialisation; the maps get noise
        for p in (net.view.density, net.view.appearance, net.view.surface):
            p.normal_(0.0, 0.5)
        net.motion.free.fill_(3.0)  # free everywhere but where a test puts a wall
        net.motion.steps.zero_()
        net.motion.steps[1] = torch.tensor([0.1, 0.0])  # forward
        net.motion.steps[4] = torch.tensor([0.0, 0.08])  # right
    net.eval()
    return net


@pytest.fixture(scope="module")
def tiny() -> MazeStateModel:
    return MazeStateModel(random_state_net(), "tiny-state-random")


def _pool(model: MazeStateModel, chunks: int) -> KVPool:
    kv = model.spec.kv
    return KVPool(kv.num_layers, chunks * F, 1, kv.num_kv_heads, kv.head_dim, kv.dtype)


def _located(x: float, z: float, yaw: float) -> torch.Tensor:
    return torch.tensor([x, z, yaw, 1.0])


def test_is_a_world_model_of_one_maze(tiny: MazeStateModel) -> None:
    spec = tiny.spec
    assert isinstance(tiny, WorldModel)
    assert spec.world == "maze" and spec.scenes == (3,) and spec.camera is not None
    assert spec.kv.tokens_per_frame == 1 and spec.kv.num_layers == 1 and spec.kv.head_dim == TINY.token_dim
    assert spec.schedule == (0.0,) and spec.chunk_latent_shape == (F, 64, 64, 3)


def test_a_step_turns_with_the_yaw_and_a_wall_stops_it_and_it_slides() -> None:
    net = random_state_net()
    m = net.motion
    fwd = torch.ones(1, 4, dtype=torch.long)
    xz, _ = m.walk(torch.tensor([4.5]), torch.tensor([4.5]), torch.full((1, 4), math.pi / 2), fwd, hard=True)
    assert torch.allclose(xz[0], torch.tensor([[4.5, 4.6], [4.5, 4.7], [4.5, 4.8], [4.5, 4.9]]), atol=1e-5)
    with torch.no_grad():  # a wall: the walker's centre may not pass x = 5.25 (grid points from 5.25 on)
        m.free[..., round(5.25 * TINY.free_per_cell) :] = -3.0
    yaw = torch.full((1, 12), math.pi / 4)  # into the wall at 45 degrees: stops along x, slides along z
    xz, _ = m.walk(torch.tensor([4.5]), torch.tensor([4.5]), yaw, torch.ones(1, 12, dtype=torch.long), hard=True)
    assert float(xz[0, :, 0].detach().max()) < 5.25
    assert float(xz[0, -1, 1].detach()) == pytest.approx(4.5 + 12 * 0.1 * math.sin(math.pi / 4), abs=1e-4)
    assert torch.equal(xz[0, -3:, 0], xz[0, -1:, 0].expand(3))  # stopped: x stays


def test_a_walker_a_hair_inside_a_walls_band_slides_along_it_but_not_into_it() -> None:
    """A clearance map 0.002 cell too pessimistic in front of a wall at x = 5.5 (the band ends at
    x = 5.25): from x = 5.25 the map reads blocked, yet a step along the wall is taken (the slide
    rule), a step into it is not, and walking into it at a slant only ever slides."""
    net = random_state_net()
    m = net.motion
    n = TINY.grid_points(TINY.free_per_cell)
    with torch.no_grad():
        gx = torch.arange(n, dtype=torch.float32) / TINY.free_per_cell
        m.free.copy_((5.25 - gx - 0.002).expand(n, n)[None, None])  # columns index x
    with torch.no_grad():
        x0, z0 = torch.tensor([5.25]), torch.tensor([4.5])
        along, _ = m.walk(x0, z0, torch.full((1, 3), math.pi / 2), torch.ones(1, 3, dtype=torch.long))
        assert torch.allclose(along[0], torch.tensor([[5.25, 4.6], [5.25, 4.7], [5.25, 4.8]]), atol=1e-5)
        into, gates = m.walk(x0, z0, torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.long))
        assert torch.equal(into[0], torch.tensor([[5.25, 4.5]]).expand(3, 2)) and bool((gates[0, :, 0] <= 0).all())
        back, _ = m.walk(x0, z0, torch.full((1, 1), math.pi), torch.ones(1, 1, dtype=torch.long))
        assert float(back[0, 0, 0]) == pytest.approx(5.15, abs=1e-5)
        slant, _ = m.walk(torch.tensor([4.5]), z0, torch.full((1, 20), math.pi / 6),
                          torch.ones(1, 20, dtype=torch.long))
        assert float(slant[0, :, 0].max()) < 5.25 and float(slant[0, -1, 1]) == pytest.approx(5.5, abs=1e-4)


def test_frames_are_the_view_from_the_carried_state(tiny: MazeStateModel) -> None:
    prompt = tiny.encode_prompt("an ice maze", 0)
    acts = tiny.make_actions([1, 4], [[0.1, 0.0, 0.1, 0.0], [0.2, 0.05, 0.1, 0.05]])
    pool = _pool(tiny, 2)
    ctx = tiny.gather_context(pool, [])
    carry = _located(6.5, 6.5, 1.0)
    x1 = tiny.denoise_step(torch.zeros(tiny.spec.chunk_latent_shape), 0.0, acts, prompt, ctx, carry)
    c, s = math.cos(1.1), math.sin(1.1)
    x_a, z_a = 6.5 + 0.1 * c, 6.5 + 0.1 * s  # forward at yaw 1.1
    c, s = math.cos(1.2), math.sin(1.2)
    x_b, z_b = x_a - 0.08 * s, z_a + 0.08 * c  # right at yaw 1.2
    with torch.no_grad():
        want = tiny.net.view.frames(torch.tensor([x_a, x_b]), torch.tensor([z_a, z_b]), torch.tensor([1.1, 1.2]),
                                    torch.tensor([0.0, 0.05]), torch.tensor([1, 1]))
    assert torch.allclose(x1, want.clamp(-1, 1), atol=1e-4)
    new = tiny.commit(x1, acts, prompt, ctx, carry, KVWriter(pool, [0, 1], tiny.spec.kv))
    assert torch.allclose(new, torch.tensor([x_b, z_b, 1.0, 1.0]), atol=1e-5) and torch.equal(carry,
                                                                                              _located(6.5, 6.5, 1.0))


def test_denoise_writes_nothing_and_commit_writes_only_its_slots(tiny: MazeStateModel) -> None:
    prompt = tiny.encode_prompt("a dungeon", 0)
    pool = _pool(tiny, 4)
    acts = tiny.make_actions([1, 1], [[0.3, 0.0, 0.0, 0.0]] * 2)
    carry = tiny.commit(torch.zeros(tiny.spec.chunk_latent_shape), acts, prompt, tiny.gather_context(pool, []),
                        _located(3.5, 3.5, 0.0), KVWriter(pool, [0, 1], tiny.spec.kv))
    before = (pool.k.clone(), pool.v.clone())
    ctx = tiny.gather_context(pool, [(0, 1)])
    a = tiny.denoise_step(torch.randn(tiny.spec.chunk_latent_shape), 0.0, acts, prompt, ctx, carry)
    b = tiny.denoise_step(torch.randn(tiny.spec.chunk_latent_shape), 0.0, acts, prompt, ctx, carry)
    assert torch.equal(pool.k, before[0]) and torch.equal(pool.v, before[1]) and torch.equal(a, b)
    tiny.commit(a, acts, prompt, ctx, carry, KVWriter(pool, [5, 6], tiny.spec.kv))
    changed = ((pool.k != before[0]) | (pool.v != before[1])).any(dim=(0, 2, 3)).nonzero().flatten().tolist()
    assert changed == [5, 6]


def test_the_context_is_the_committed_state_tokens_wherever_they_are_held(tiny: MazeStateModel) -> None:
    prompt = tiny.encode_prompt("a dungeon", 0)
    acts = tiny.make_actions([4, 1], [[0.5, 0.0, 0.0, 0.0]] * 2)
    views = []
    for ids in ([0, 1], [6, 3]):
        pool = _pool(tiny, 4)
        tiny.commit(torch.zeros(tiny.spec.chunk_latent_shape), acts, prompt, tiny.gather_context(pool, []),
                    _located(3.5, 3.5, 0.0), KVWriter(pool, ids, tiny.spec.kv))
        views.append(tiny.gather_context(pool, [tuple(ids)]))
    with torch.no_grad():
        _, _, k, v = tiny.net.chunk(_located(3.5, 3.5, 0.0), acts.keys, acts.camera, torch.tensor([0]), False)
    for ctx in views:
        assert ctx.k is not None and ctx.v is not None and ctx.n_frames == F
        assert torch.equal(ctx.k[0, 0, :, 0], k) and torch.equal(ctx.v[0, 0, :, 0], v)


def test_bad_input_is_refused(tiny: MazeStateModel) -> None:
    prompt = tiny.encode_prompt("", 0)
    acts = tiny.make_actions([0, 0])
    ctx = tiny.gather_context(_pool(tiny, 1), [])
    with pytest.raises(ValueError, match="carry"):
        tiny.denoise_step(torch.zeros(tiny.spec.chunk_latent_shape), 0.0, acts, prompt, ctx, torch.zeros(3))
    with pytest.raises(ValueError, match="latents"):
        tiny.denoise_step(torch.zeros(1, 64, 64, 3), 0.0, acts, prompt, ctx, tiny.initial_carry())
    with pytest.raises(ValueError, match="keys in"):
        tiny.make_actions([0, 9])
    with pytest.raises(ValueError, match="at most"):
        tiny.gather_context(_pool(tiny, 8), [(2 * i, 2 * i + 1) for i in range(5)])


def test_a_session_starts_located_from_its_frames_and_refuses_other_scenes(tiny: MazeStateModel) -> None:
    with World(tiny, max_sessions=2) as world:
        s = world.open_session(prompt="a jungle maze", scene_seed=3)
        carry = world.sessions.runtime(s.session_id).state.carry
        assert float(carry[LOCATED]) == 1.0
        again = world.open_session(prompt="a jungle maze", scene_seed=3)  # the same frames: the same pose
        assert torch.equal(world.sessions.runtime(again.session_id).state.carry, carry)
        again.close()
        frame = torch.from_numpy(s.step().frames[0].astype(np.float32) / 127.5 - 1.0)
        assert frame.shape == (64, 64, 3)
        with pytest.raises(SessionEventError, match=r"knows the scenes \[3\]"):
            world.open_session(prompt="a jungle maze", scene_seed=4)


def _play(world: World, how: str) -> list[str]:
    s = world.open_session(prompt="a dungeon", scene_seed=3, seed=5)
    s.submit_event(0, "key", {"key": "forward", "down": True})
    s.submit_event(1, "camera", {"mode": "velocity", "yaw": 3 * DTHETA, "pitch": 0.0})
    s.step()
    cp = s.checkpoint()
    first = [s.step() for _ in range(5)]  # past the window (3 chunks): the rolling K/V
    if how == "rollback":
        s.rollback(cp)
    elif how == "hibernate":
        s.hibernate()
    elif how == "migrate":
        s = s.migrate(World(world.model, max_sessions=2))
    again = [s.step() for _ in range(5)]
    s.close()
    return [r.frames_sha256 for r in first + again]


@pytest.mark.parametrize("how", ["rollback", "hibernate", "migrate"])
def test_rollback_hibernation_and_migration_are_bit_identical(tiny: MazeStateModel, how: str) -> None:
    with World(tiny, max_sessions=4) as world:
        plain = _play(world, "none")
        moved = _play(world, how)
    if how == "rollback":  # the replay after the rollback is the first run again
        assert moved[5:] == moved[:5] == plain[:5]
    else:  # the moved session goes on as the unmoved one
        assert moved == plain
    assert len(set(plain)) > 5  # the walker moved and turned: the frames differ


@pytest.mark.slow
def test_compiled_kv_matches_eager_at_every_step() -> None:
    from execstate_bench.world_numerics import compare_numerics

    eager = MazeStateModel(random_state_net(), "tiny-state-random")
    compiled = MazeStateModel(random_state_net(), "tiny-state-random", numerics="compiled")
    r = compare_numerics(eager, compiled, steps=10, seed=3)  # scene 3: the maze the model knows
    assert r["state_keys_differ"] and len(r["kv_max_diff_by_step"]) == 11
    assert r["kv_max_diff"] == 0.0 and r["frame_max_diff_levels"] <= 1, r  # the state step is eager in both
