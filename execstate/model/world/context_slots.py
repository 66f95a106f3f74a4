"""The pool slots of a world context's chunks, checked: what every world model's
``gather_context`` reads from the pool (the grid model, ``model.py``; both maze models)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from execstate.model.world.interface import WorldSpec
from execstate.state.kv_pool import KVPool


def context_slots(spec: WorldSpec, pool: KVPool, chunks: Sequence[Sequence[int]]
                  ) -> tuple[tuple[tuple[int, ...], ...], torch.Tensor | None]:
    """The context's key (its chunks' block ids) and the pool slots of its tokens in order (None for
    no chunks); ``ValueError`` for more chunks than sink + window, a pool of another layout, or a
    chunk that is not its blocks in the pool."""
    layout = spec.kv
    bpc = layout.blocks_per_chunk(pool.block_size)
    limit = spec.sink_chunks + spec.max_window_chunks
    if len(chunks) > limit:
        raise ValueError(f"a context holds at most {limit} chunks (sink + window), got {len(chunks)}")
    if pool.k.shape[0] != layout.num_layers or pool.k.shape[2:] != (layout.num_kv_heads, layout.head_dim):
        raise ValueError(f"pool layout {tuple(pool.k.shape)} does not match the model's {layout}")
    ids = [int(b) for c in chunks for b in c]
    if any(len(c) != bpc for c in chunks) or any(not 0 <= b < pool.num_blocks for b in ids):
        raise ValueError(f"each chunk must be {bpc} block ids in [0, {pool.num_blocks})")
    key = tuple(tuple(int(b) for b in c) for c in chunks)
    if not chunks:
        return key, None
    bs = pool.block_size
    return key, (torch.tensor(ids)[:, None] * bs + torch.arange(bs)[None, :]).reshape(-1)
