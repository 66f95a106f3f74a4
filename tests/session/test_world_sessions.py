"""World-model sessions (session/world_*.py) on a tiny random model: reproducibility (rollback,
fork vs a fresh session), events at chunk boundaries, prompt changes, bounded memory, identity,
isolation; the pool's integrity (every reference held exactly once) after every test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from world_helpers import TINY, run, start_frames, table_kv, tiny_world_model

from execstate.session.runtime.events import SessionEventError
from execstate.session.world.offline import World


@pytest.fixture(scope="module")
def model():
    return tiny_world_model()


@pytest.fixture
def world(model):
    w = World(model=model, max_sessions=6)
    yield w
    w.sessions.check_integrity()
    w.close()
    w.sessions.check_integrity()
    assert w.sessions.store.pool.num_used == 0 and w.sessions.store.holds.num_holders == 0


LEFT = [("key", {"key": "left", "down": True})]
PLAN = [LEFT, [], [("action", {"key": "up"})], [("key", {"key": "left", "down": False})],
        [("prompt", {"text": "a snow maze"})], [("key", {"key": "down", "down": True})], [], []]


def test_rollback_reproduces_frames_and_kv_bit_for_bit(world: World) -> None:
    s = world.open_session(prompt="a meadow maze", seed=7, start_frames=start_frames())
    run(s, PLAN[:2])
    cp = s.checkpoint()
    first = run(s, PLAN[2:])
    kv_first = table_kv(world, s)
    s.rollback(cp)
    assert s.step_index == 2
    again = run(s, PLAN[2:])
    assert again == first and table_kv(world, s) == kv_first
    # the noise is session state: another seed gives other frames for the same events
    other = world.open_session(prompt="a meadow maze", seed=8, start_frames=start_frames())
    assert run(other, PLAN)[2:] != first


def test_fork_is_independent_and_equals_a_fresh_session(world: World) -> None:
    a = world.open_session(prompt="a meadow maze", seed=3, start_frames=start_frames())
    run(a, PLAN[:3])
    cp = a.checkpoint()
    fork = a.fork(cp)
    branch = [[("action", {"key": "right"})], [("prompt", {"text": "lava"})], []]
    fork_frames = run(fork, branch)
    a_frames = run(a, PLAN[3:6])  # the parent goes on differently
    fresh = world.open_session(prompt="a meadow maze", seed=3, start_frames=start_frames())
    fresh_frames = run(fresh, PLAN[:3] + branch)
    assert fork_frames == fresh_frames[3:] and table_kv(world, fork) == table_kv(world, fresh)
    fresh.close()
    fresh = world.open_session(prompt="a meadow maze", seed=3, start_frames=start_frames())
    assert run(fresh, PLAN[:6])[3:] == a_frames and table_kv(world, a) == table_kv(world, fresh)
    assert fork.state_key() != fresh.state_key()  # other branch id
    a.close()  # the fork keeps its shared blocks
    assert run(fork, [[]]) and fork.info().blocks_in_use > 0


def test_events_apply_at_boundaries_with_last_write_wins_and_held_keys(world: World) -> None:
    s = world.open_session(seed=0, start_frames=start_frames())
    s.submit_event(0, "key", {"key": "left", "down": True})
    r = s.step()
    assert r.keys == ("left", "left") and r.events == {"started": [0], "active": [0], "completed": []}
    r = s.step()  # held across steps: one event, active
    assert r.keys == ("left", "left") and r.events == {"started": [], "active": [0], "completed": []}
    s.submit_event(1, "key", {"key": "left", "down": True})  # auto-repeat: stays event 0
    s.submit_event(2, "action", {"key": "up"})
    s.submit_event(3, "action", {"keys": ["down", "none"]})  # last write wins per kind
    r = s.step()
    assert r.keys == ("down", "none")
    assert r.events == {"started": [1, 3], "active": [0], "completed": [1, 2, 3]}
    s.submit_event(4, "key", {"key": "right", "down": True})  # another key: releases event 0
    r = s.step()
    assert r.keys == ("right", "right") and r.events == {"started": [4], "active": [4], "completed": [0]}
    s.submit_event(5, "key", {"key": "right", "down": False})
    s.submit_event(6, "composite", {"events": [{"kind": "prompt", "data": {"text": "desert"}},
                                               {"kind": "action", "data": {"key": "left"}}]})
    r = s.step()
    assert r.keys == ("left", "left") and r.prompt_version == 1
    assert r.events == {"started": [5, 6], "active": [], "completed": [4, 5, 6]}
    r = s.step()
    assert r.keys == ("none", "none") and r.events == {"started": [], "active": [], "completed": []}
    assert s.info().held_key is None and s.info().prompt == "desert"


def test_held_key_state_survives_rollback_and_fork(world: World) -> None:
    s = world.open_session(seed=0, start_frames=start_frames())
    s.submit_event(0, "key", {"key": "up", "down": True})
    s.step()
    cp = s.checkpoint()
    s.submit_event(1, "key", {"key": "up", "down": False})
    assert s.step().keys == ("none", "none")
    s.rollback(cp)
    assert s.step().keys == ("up", "up")
    assert s.fork(cp).step().events == {"started": [], "active": [0], "completed": []}


def test_prompt_change_recomputes_only_the_prompt(world: World, model) -> None:
    calls = []
    orig = model.encode_prompt

    def counting(prompt, version):
        calls.append((prompt, version))
        return orig(prompt, version)

    model.encode_prompt = counting
    try:
        s = world.open_session(prompt="a meadow maze", seed=1, start_frames=start_frames())
        run(s, [[]])
        before = table_kv(world, s)
        calls.clear()
        s.submit_event(s.next_event_id(), "prompt", {"text": "a lava maze"})
        r = s.step()
        after = table_kv(world, s)
        assert calls == [("a lava maze", 1)] and r.prompt_version == 1
        assert after[:-1] == before  # every committed chunk's K/V untouched (window not full yet)
        same = world.open_session(prompt="a meadow maze", seed=1, start_frames=start_frames())
        run(same, [[], []])
        assert table_kv(world, same)[-1] != after[-1]  # the new prompt conditions the new chunk
        calls.clear()
        s.step()
        assert calls == []  # once per version
    finally:
        del model.encode_prompt


def test_500_steps_in_bounded_memory(world: World) -> None:
    s = world.open_session(seed=0, start_frames=start_frames(), window_chunks=2)
    bpc = world.sessions.store.blocks_per_chunk
    used = []
    for i in range(500):
        if i % 7 == 0:
            s.submit_event(s.next_event_id(), "action", {"key": ["up", "down", "left", "right"][i % 4]})
        used.append((s.step().blocks_in_use, world.sessions.store.pool.num_used))
    assert used[0] == (2 * bpc, 2 * bpc)  # the start (the sink) and the first generated chunk
    assert set(used[1:]) == {(3 * bpc, 3 * bpc)}  # sink + window of 2: constant once full
    assert s.info().n_chunks == 501


def test_eager_and_compiled_never_share_state_keys(model) -> None:
    from world_helpers import tiny_world_model as make

    eager, compiled = World(model=model), World(model=make(numerics="compiled"), numerics="compiled")
    a = eager.open_session(seed=0, start_frames=start_frames(), session_id="x")
    b = compiled.open_session(seed=0, start_frames=start_frames(), session_id="x")
    assert eager.sessions.store.provenance.numerics == "eager+cpu-torch-v1"
    assert compiled.sessions.store.provenance.numerics == "compiled+cpu-torch-v1"
    assert a.state_key() != b.state_key()
    other = World(model=make(seed=1))  # another weights version
    c = other.open_session(seed=0, start_frames=start_frames(), session_id="x")
    assert c.state_key() not in (a.state_key(), b.state_key())
    with pytest.raises(ValueError, match="numerics"):
        World(model=model, numerics="compiled")
    for w in (eager, compiled, other):
        w.close()


def test_sessions_are_isolated(world: World) -> None:
    plans = [[[("action", {"key": k})] for k in keys] for keys in
             (["up", "up", "left", "none"], ["down", "right", "right", "up"], ["left"] * 4, ["none"] * 4)]
    alone = []
    for i, plan in enumerate(plans):
        s = world.open_session(seed=i, start_frames=start_frames(seed=i))
        alone.append(run(s, plan))
        s.close()
    sessions = [world.open_session(seed=i, start_frames=start_frames(seed=i)) for i in range(4)]
    together: list[list[str]] = [[] for _ in plans]
    for step in range(4):
        for i in (3, 1, 0, 2):
            together[i] += run(sessions[i], [plans[i][step]])
    assert together == alone


def test_refusals(world: World) -> None:
    s = world.open_session(seed=0, start_frames=start_frames())
    cases = [("key", {"key": "jump", "down": True}, "key must be one of"),
             ("key", {"key": "left"}, "down"),
             ("action", {"keys": ["up"]}, "list of 2 key names"),
             ("camera", {"delta": [1.0, 0.0]}, "no camera"),
             ("prompt", {"text": 3}, "text must be a string"),
             ("warp", {}, "unknown event kind")]
    for kind, data, msg in cases:
        with pytest.raises(SessionEventError, match=msg) as e:
            s.submit_event(10, kind, data)
        assert e.value.code == "invalid"
    s.submit_event(10, "action", {"key": "up"})
    with pytest.raises(SessionEventError) as e:
        s.submit_event(9, "action", {"key": "up"})
    assert e.value.code == "stale"
    assert s.submit_event(10, "action", {"key": "down"}).duplicate
    with pytest.raises(SessionEventError) as e:
        world.open_session(seed=0, start_frames=np.zeros((2, 8, 8, 3), np.uint8))
    assert e.value.code == "invalid" and "uint8[2, 24, 24, 3]" in str(e.value)
    with pytest.raises(SessionEventError) as e:
        world.open_session(window_chunks=TINY.window_chunks + 1)
    assert e.value.code == "invalid" and "window_chunks" in str(e.value)
    s.close()
    with pytest.raises(SessionEventError) as e:
        s.step()
    assert e.value.code == "closed"
    with pytest.raises(SessionEventError) as e:
        s.submit_event(11, "action", {"key": "up"})
    assert e.value.code == "closed"


def test_backpressure_and_capacity(model) -> None:
    w = World(model=model, max_sessions=4, max_session_events=2)
    ss = [w.open_session(seed=i) for i in range(4)]
    with pytest.raises(SessionEventError) as e:
        w.open_session()
    assert e.value.code == "capacity"
    ss[0].submit_event(0, "action", {"key": "up"})
    ss[0].submit_event(1, "action", {"key": "up"})
    with pytest.raises(SessionEventError) as e:
        ss[0].submit_event(2, "action", {"key": "up"})
    assert e.value.code == "backpressure"
    assert ss[0].step().events["completed"] == [0, 1]
    w.close()
    w.sessions.check_integrity()


def test_memory_budget_refuses_a_step_beyond_it(model) -> None:
    bpc = model.spec.kv.blocks_per_chunk(model.spec.kv.tokens_per_frame)
    w = World(model=model, session_blocks=5 * bpc)  # window (1 + 2) + 1 in flight + 1 spare chunk
    s = w.open_session(seed=0, start_frames=start_frames())
    run(s, [[]] * 3)
    cp = s.checkpoint()  # pins sink + 2 chunks: as the window slides they stay held
    run(s, [[]] * 2)
    with pytest.raises(SessionEventError) as e:
        s.step()
    assert e.value.code == "budget" and "budget of" in str(e.value)
    assert s.status == "open" and s.step_index == 5  # refused, nothing changed
    s.release_checkpoint(cp)
    s.step()
    w.sessions.check_integrity()
    w.close()
    w.sessions.check_integrity()
    assert w.sessions.store.pool.num_used == 0


def test_first_step_without_start_frames_generates_from_the_prompt(world: World) -> None:
    a = world.open_session(prompt="snow", seed=2)
    b = world.open_session(prompt="snow", seed=2)
    assert a.info().n_chunks == 0 and a.info().blocks_in_use == 0
    ra, rb = a.step(), b.step()
    assert ra.frames.shape == (2, 24, 24, 3) and ra.frames.dtype == np.uint8
    assert ra.frames_sha256 == rb.frames_sha256
    a.reset()  # back to the origin: empty
    assert a.step().frames_sha256 == ra.frames_sha256


def test_close_during_compute_discards_the_step(world: World, model) -> None:
    s = world.open_session(seed=0, start_frames=start_frames())
    orig = model.decode

    def closing_decode(latents: torch.Tensor):
        s.close()  # another thread's close, while the chunk is being computed
        return orig(latents)

    model.decode = closing_decode
    try:
        with pytest.raises(SessionEventError) as e:
            s.step()
        assert e.value.code == "closed"
    finally:
        del model.decode


def test_session_equals_the_offline_rollout_driver(world: World, model) -> None:
    """An independent oracle: model/world/rollout.WorldRollout (its own pool, block size and
    bookkeeping) gives the same frames for the same seed, start, prompt and keys."""
    from execstate.model.world.rollout import WorldRollout

    keys = ["up", "up", "left", "none", "right", "down", "down", "left", "up", "none"]
    ro = WorldRollout(model, seed=5, prompt="a desert maze", block_size=model.spec.kv.tokens_per_chunk)
    ro.start(start_frames(), [0, 0])
    s = world.open_session(prompt="a desert maze", seed=5, start_frames=start_frames())
    for k in keys:
        want = ro.step([model.spec.keys.index(k)] * 2)
        got = s.step(action=k).frames
        assert np.array_equal(got, want)


@pytest.mark.parametrize("sink,window", [(1, 1), (0, 2), (0, 1), (1, 2)])
def test_window_and_sink_sizes(world: World, sink: int, window: int) -> None:
    s = world.open_session(seed=0, start_frames=start_frames(), sink_chunks=sink, window_chunks=window)
    start_kv = table_kv(world, s)[0]
    bpc = world.sessions.store.blocks_per_chunk
    for i in range(6):
        s.step(action="up")
        kv = table_kv(world, s)
        assert len(kv) == min(i + 2, sink + window)
        assert (kv[0] == start_kv) == (sink == 1 or i + 2 <= window)  # the sink stays; without one it rolls out
    s.checkpoint()  # the origin (start chunk) and this checkpoint pin what the window released
    assert world.sessions.store.pool.num_used == (sink + window + (1 - sink)) * bpc
