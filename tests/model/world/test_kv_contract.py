"""The K/V contract of the world model (interface.py): denoise reads only, commit writes exactly
its chunk's slots, the context view depends only on the blocks' bytes and order, and a rolling
window over block tables equals a contiguous cache of the kept chunks."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from execstate.model.world import renderer
from execstate.model.world.interface import KVWriter, WorldModel
from execstate.model.world.model import ChunkedWorldModel
from execstate.model.world.sampler import denoise_chunk, generate_chunk
from execstate.model.world.window import RollingWindow
from execstate.state.kv_pool import KVPool


def _pool(model: WorldModel, num_blocks: int, block_size: int = 16) -> KVPool:
    kv = model.spec.kv
    return KVPool(kv.num_layers, num_blocks, block_size, kv.num_kv_heads, kv.head_dim, kv.dtype)


def _digest(pool: KVPool) -> str:
    return hashlib.sha256(pool.k.numpy().tobytes() + pool.v.numpy().tobytes()).hexdigest()


def _frames(model: WorldModel, seed: int) -> np.ndarray:
    f = model.spec.frames_per_chunk
    _, frames = renderer.trajectory(renderer.initial_state(seed), np.full(f, renderer.RIGHT))
    return frames


def _noise(model: WorldModel, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((len(model.spec.schedule), *model.spec.chunk_latent_shape), generator=g)


def _fill(model: ChunkedWorldModel, pool: KVPool, chunks: list[list[int]], seed: int = 0) -> torch.Tensor:
    """Commit one rendered chunk per entry of ``chunks`` (each attending to the sink and the
    window before it)."""
    prompt = model.encode_prompt("a snow maze", 0)
    window = RollingWindow(1, 2)
    carry = model.initial_carry()
    for i, ids in enumerate(chunks):
        ctx = model.gather_context(pool, window.context([tuple(c) for c in chunks[:i]]))
        carry = model.commit(model.encode_frames(_frames(model, seed + i)), model.make_actions([1, 2]), prompt, ctx,
                             carry, KVWriter(pool, ids, model.spec.kv))
    return carry


def test_spec_and_layout(tiny_model: ChunkedWorldModel) -> None:
    spec = tiny_model.spec
    assert spec.kv.tokens_per_chunk == 32 and spec.chunk_latent_shape == (2, 16, 432)
    assert spec.kv.blocks_per_chunk(16) == 2 and spec.kv.blocks_per_chunk(32) == 1
    with pytest.raises(ValueError, match="does not divide"):
        spec.kv.blocks_per_chunk(12)
    assert spec.kv.bytes_per_chunk() == 2 * 2 * 32 * 2 * 16 * 4
    assert isinstance(tiny_model, WorldModel) and spec.numerics == "eager"


def test_denoise_does_not_write_the_pool(tiny_model: ChunkedWorldModel) -> None:
    pool = _pool(tiny_model, 8)
    carry = _fill(tiny_model, pool, [[0, 1], [2, 3]])
    before, carry_before = _digest(pool), carry.clone()
    ctx = tiny_model.gather_context(pool, [[0, 1], [2, 3]])
    prompt = tiny_model.encode_prompt("night", 0)
    a = denoise_chunk(tiny_model, _noise(tiny_model, 1), tiny_model.make_actions([3, 4]), prompt, ctx, carry)
    b = denoise_chunk(tiny_model, _noise(tiny_model, 1), tiny_model.make_actions([3, 4]), prompt, ctx, carry)
    assert _digest(pool) == before and torch.equal(carry, carry_before)
    assert torch.equal(a, b)


def test_commit_writes_exactly_the_chunk_slots(tiny_model: ChunkedWorldModel) -> None:
    pool = _pool(tiny_model, 8)
    carry = _fill(tiny_model, pool, [[5, 1]])
    k0, v0 = pool.k.clone(), pool.v.clone()
    ctx = tiny_model.gather_context(pool, [[5, 1]])
    x1, nxt = generate_chunk(tiny_model, _noise(tiny_model, 2), tiny_model.make_actions([0, 1]),
                             tiny_model.encode_prompt("", 0), ctx, carry, KVWriter(pool, [6, 3], tiny_model.spec.kv))
    assert torch.equal(nxt, x1) and not torch.equal(nxt, carry)  # the carry: the last 2 frames
    changed = ((pool.k != k0) | (pool.v != v0)).flatten(2).any(-1).any(0)  # per slot
    expected = torch.zeros(8 * 16, dtype=torch.bool)
    expected[6 * 16 : 7 * 16] = expected[3 * 16 : 4 * 16] = True
    assert torch.equal(changed, expected)


def test_context_view_depends_on_bytes_and_order_not_block_ids(tiny_model: ChunkedWorldModel) -> None:
    a, b = _pool(tiny_model, 8), _pool(tiny_model, 8)
    _fill(tiny_model, a, [[0, 1], [2, 3]])
    _fill(tiny_model, b, [[7, 4], [5, 6]])
    ca = tiny_model.gather_context(a, [[0, 1], [2, 3]])
    cb = tiny_model.gather_context(b, [[7, 4], [5, 6]])
    assert torch.equal(ca.k, cb.k) and torch.equal(ca.v, cb.v) and ca.n_frames == cb.n_frames == 4
    swapped = tiny_model.gather_context(a, [[2, 3], [0, 1]])  # same blocks, other order: other positions
    assert not torch.equal(swapped.k, ca.k)


def test_rolling_block_table_equals_contiguous_cache_of_kept_chunks(tiny_model: ChunkedWorldModel) -> None:
    """After a roll the context is sink + newest chunks in scattered blocks; copying those chunks
    into a fresh pool, contiguously, gives bit-identical K/V and outputs."""
    pool = _pool(tiny_model, 12)
    table = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    carry = _fill(tiny_model, pool, table)
    kept = [table[0], table[3], table[4]]  # sink + window of 2 (chunks 1 and 2 released)
    fresh = _pool(tiny_model, 6)
    for dst, src in enumerate(b for c in kept for b in c):
        fresh.k[:, fresh.block_slots(dst)] = pool.k[:, pool.block_slots(src)]
        fresh.v[:, fresh.block_slots(dst)] = pool.v[:, pool.block_slots(src)]
    prompt, actions = tiny_model.encode_prompt("lava", 0), tiny_model.make_actions([2, 2])
    rolled = tiny_model.gather_context(pool, kept)
    contiguous = tiny_model.gather_context(fresh, [[0, 1], [2, 3], [4, 5]])
    x_rolled = denoise_chunk(tiny_model, _noise(tiny_model, 3), actions, prompt, rolled, carry)
    x_contig = denoise_chunk(tiny_model, _noise(tiny_model, 3), actions, prompt, contiguous, carry)
    assert torch.equal(x_rolled, x_contig)


def test_positions_stay_in_the_trained_range(tiny_model: ChunkedWorldModel) -> None:
    pool = _pool(tiny_model, 8)
    with pytest.raises(ValueError, match="at most 3 chunks"):
        tiny_model.gather_context(pool, [[0, 1], [2, 3], [4, 5], [6, 7]])


@pytest.mark.parametrize("chunks", [[[0]], [[0, 1, 2]], [[0, 8]], [[-1, 0]]])
def test_bad_context_is_a_value_error(tiny_model: ChunkedWorldModel, chunks: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="block ids"):
        tiny_model.gather_context(_pool(tiny_model, 8), chunks)


def test_bad_writer_actions_and_latents_are_value_errors(tiny_model: ChunkedWorldModel) -> None:
    pool = _pool(tiny_model, 8)
    layout = tiny_model.spec.kv
    for ids in ([0], [0, 0], [0, 9]):
        with pytest.raises(ValueError):
            KVWriter(pool, ids, layout)
    for keys in ([0], [0, 5], [0, -1]):
        with pytest.raises(ValueError, match="keys"):
            tiny_model.make_actions(keys)
    with pytest.raises(ValueError, match="no camera"):
        tiny_model.make_actions([0, 0], camera=[[0.0], [0.0]])
    ctx = tiny_model.gather_context(pool, [])
    with pytest.raises(ValueError, match="shape"):
        tiny_model.denoise_step(torch.zeros(3, 16, 432), 0.0, tiny_model.make_actions([0, 0]),
                                tiny_model.encode_prompt("", 0), ctx, tiny_model.initial_carry())
    with pytest.raises(ValueError, match="carry"):
        tiny_model.denoise_step(torch.zeros(2, 16, 432), 0.0, tiny_model.make_actions([0, 0]),
                                tiny_model.encode_prompt("", 0), ctx, torch.zeros(16, 432))
    with pytest.raises(ValueError, match="uint8"):
        tiny_model.encode_frames(np.zeros((2, 32, 32, 3), np.float32))
