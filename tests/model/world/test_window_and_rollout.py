"""Rolling window (pure block-table operations) and the offline session driver: bounded memory,
checkpoint/rollback reproducing frames bit for bit, prompt versions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.model.world import renderer
from execstate.model.world.model import ChunkedWorldModel
from execstate.model.world.rollout import WorldRollout
from execstate.model.world.window import RollingWindow


@settings(max_examples=200, deadline=None)
@given(sink=st.integers(0, 3), window=st.integers(1, 4), n=st.integers(0, 12), bpc=st.integers(1, 3))
def test_roll_keeps_sink_and_newest_and_releases_the_middle(sink: int, window: int, n: int, bpc: int) -> None:
    table = [tuple(range(i * bpc, (i + 1) * bpc)) for i in range(n)]
    w = RollingWindow(sink, window)
    kept, released = w.roll(table)
    assert kept == w.context(table)
    if n <= sink + window:
        assert kept == table and released == []
    else:
        assert kept == table[:sink] + table[n - window :]
        assert released == [b for c in table[sink : n - window] for b in c]
    assert sorted(released + [b for c in kept for b in c]) == list(range(n * bpc))


def test_window_validation() -> None:
    with pytest.raises(ValueError):
        RollingWindow(1, 0)


def _start(model: ChunkedWorldModel, **kw: object) -> tuple[WorldRollout, np.ndarray]:
    f = model.spec.frames_per_chunk
    keys = renderer.random_actions(np.random.default_rng(0), 40 * f)
    _, frames = renderer.trajectory(renderer.initial_state(2, "desert"), keys)
    ro = WorldRollout(model, seed=9, prompt="desert", **kw)
    assert np.array_equal(ro.start(frames[:f], keys[:f]), frames[:f])  # the start is committed as given
    return ro, keys


def test_memory_is_bounded_by_the_window(tiny_model: ChunkedWorldModel) -> None:
    ro, keys = _start(tiny_model)
    f = tiny_model.spec.frames_per_chunk
    for i in range(1, 30):
        ro.step(keys[i * f : (i + 1) * f])
        assert ro.blocks_in_use == min(i + 1, 3) * 2
        ro.blocks.check_integrity()
    assert ro.table[0] == (0, 1)  # the sink never moves


def test_rollback_replays_bit_for_bit_and_checkpoints_pin_blocks(tiny_model: ChunkedWorldModel) -> None:
    ro, keys = _start(tiny_model, num_blocks=16)
    f = tiny_model.spec.frames_per_chunk
    chunk = [keys[i * f : (i + 1) * f] for i in range(12)]
    for i in range(1, 4):
        ro.step(chunk[i])
    cp = ro.checkpoint()
    first = [ro.step(chunk[i]) for i in range(4, 10)]
    assert ro.blocks_in_use == 6 + 4  # the window + the checkpoint's two released middle chunks
    ro.rollback(cp)
    again = [ro.step(chunk[i]) for i in range(4, 10)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    ro.rollback(cp)
    other = ro.step(chunk[11])  # other keys, same RNG state: a different chunk
    assert not np.array_equal(other, first[0])
    ro.release(cp)
    ro.blocks.check_integrity()
    assert ro.blocks_in_use == 6


def test_prompt_change_is_a_new_version_and_keeps_the_frames_kv(tiny_model: ChunkedWorldModel) -> None:
    ro, keys = _start(tiny_model)
    f = tiny_model.spec.frames_per_chunk
    ro.step(keys[f : 2 * f])
    k, v = ro.pool.k.clone(), ro.pool.v.clone()
    p0 = ro.prompt
    ro.set_prompt("desert")  # same text: no new version
    assert ro.prompt is p0
    ro.set_prompt("a lava level")
    assert ro.prompt.version == 1 and not torch.equal(ro.prompt.k, p0.k)
    assert torch.equal(ro.pool.k, k) and torch.equal(ro.pool.v, v)  # frames' K/V untouched
    again = tiny_model.encode_prompt("a lava level", 1)
    assert torch.equal(again.k, ro.prompt.k) and torch.equal(again.v, ro.prompt.v)  # pure function


def test_prompt_reaches_the_output(tiny_model: ChunkedWorldModel) -> None:
    outs = []
    for prompt in ("snow", "lava"):
        ro, keys = _start(tiny_model)
        ro.set_prompt(prompt)
        outs.append(ro.step(keys[2:4]))
    assert not np.array_equal(*outs)


def test_rollout_validation(tiny_model: ChunkedWorldModel) -> None:
    with pytest.raises(ValueError, match="window_chunks"):
        WorldRollout(tiny_model, window_chunks=3)
    with pytest.raises(ValueError, match="needs"):
        WorldRollout(tiny_model, num_blocks=5)
    ro = WorldRollout(tiny_model)
    with pytest.raises(ValueError, match="start"):
        ro.step([0, 0])
    with pytest.raises(ValueError, match="uint8"):
        ro.start(np.zeros((1, 32, 32, 3), np.uint8))  # fails after allocating the chunk's blocks
    assert ro.blocks_in_use == 0 and ro.table == []
    ro.start()  # generated from the prompt alone
    with pytest.raises(ValueError, match="already"):
        ro.start()
    with pytest.raises(ValueError, match="keys"):
        ro.step([0, 7])
    assert ro.blocks_in_use == 2
    ro.blocks.check_integrity()
