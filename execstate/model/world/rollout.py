"""``WorldRollout``: an offline driver of one world-model session over a block pool.

It does what the session runtime does for a world session, without events or serving: it owns
a :class:`BlockPool` (block ids, reference counts) and a :class:`KVPool` (the tensors), the
session's block table (one tuple of block ids per chunk, sink first), a :class:`RollingWindow`,
the prompt's cross-attention cache (:class:`PromptKV`, re-encoded only when the prompt changes),
the carry and the noise generator (``torch.Generator``, the session's RNG state). Evaluation, benchmarks
and tests use it; the session runtime's world sessions (``session/``, the world kind) run the same
steps (``WorldModel``'s call order, ``model/world/interface.py``) on their own block tables.

- :meth:`start` commits the given first frames as chunk 0 (the sink), or generates it from the
  prompt when no frames are given.
- :meth:`step` = gather context -> S denoise iterations -> commit into freshly allocated
  blocks -> append to the table -> roll the window (release the middle chunks' blocks).
- :meth:`checkpoint` pins the table's blocks (one reference each, no copy) and saves the RNG
  state, prompt and carry; :meth:`rollback` restores them, so re-running the same actions reproduces
  the same frames bit for bit. :meth:`release` drops a checkpoint's pins.

Memory is bounded: at most ``(sink + window + 1)`` chunks of blocks in use, plus what
checkpoints pin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from execstate.model.world.interface import Carry, KVWriter, PromptKV, WorldModel
from execstate.model.world.sampler import generate_chunk
from execstate.model.world.window import Chunk, RollingWindow
from execstate.state.block_pool import BlockId, BlockPool
from execstate.state.kv_pool import KVPool


@dataclass(frozen=True)
class RolloutCheckpoint:
    table: tuple[Chunk, ...]
    rng_state: torch.Tensor
    prompt: PromptKV
    carry: Carry
    steps: int


class WorldRollout:
    def __init__(self, model: WorldModel, *, seed: int = 0, prompt: str = "", block_size: int = 16,
                 window_chunks: int | None = None, num_blocks: int | None = None) -> None:
        spec = model.spec
        window_chunks = spec.max_window_chunks if window_chunks is None else window_chunks
        if not 1 <= window_chunks <= spec.max_window_chunks:
            raise ValueError(f"window_chunks must be in [1, {spec.max_window_chunks}], got {window_chunks}")
        self.model = model
        self.window = RollingWindow(spec.sink_chunks, window_chunks)
        self.blocks_per_chunk = spec.kv.blocks_per_chunk(block_size)
        need = (self.window.max_chunks + 1) * self.blocks_per_chunk
        num_blocks = need if num_blocks is None else num_blocks
        if num_blocks < need:
            raise ValueError(f"the window needs {need} blocks, got num_blocks={num_blocks}")
        kv = spec.kv
        self.pool = KVPool(kv.num_layers, num_blocks, block_size, kv.num_kv_heads, kv.head_dim, kv.dtype)
        self.blocks = BlockPool(num_blocks)
        self.table: list[Chunk] = []
        self.gen = torch.Generator().manual_seed(seed)
        self.prompt = model.encode_prompt(prompt, 0)
        self.carry = model.initial_carry()
        self.steps = 0

    def set_prompt(self, prompt: str) -> None:
        """A prompt event: a new version of the cross-attention cache; the frames' K/V stay."""
        if prompt != self.prompt.prompt:
            self.prompt = self.model.encode_prompt(prompt, self.prompt.version + 1)

    def _commit_chunk(self, keys: Sequence[int] | np.ndarray, frames: np.ndarray | None) -> np.ndarray:
        model = self.model
        actions = model.make_actions(keys)
        ctx = model.gather_context(self.pool, self.window.context(self.table))
        block_ids = self.blocks.allocate(self.blocks_per_chunk)
        try:
            writer = KVWriter(self.pool, block_ids, model.spec.kv)
            if frames is None:
                shape = (len(model.spec.schedule), *model.spec.chunk_latent_shape)
                latents, carry = generate_chunk(model, torch.randn(shape, generator=self.gen), actions, self.prompt,
                                                ctx, self.carry, writer)
            else:
                latents = model.encode_frames(frames)
                carry = model.commit(latents, actions, self.prompt, ctx, self.carry, writer)
        except BaseException:
            self.blocks.free(block_ids)
            raise
        self.table.append(tuple(block_ids))
        self.carry = carry
        self.table, released = self.window.roll(self.table)
        self.blocks.free(BlockId(b) for b in released)
        self.steps += 1
        return model.decode(latents)

    def start(self, frames: np.ndarray | None = None, keys: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """The first chunk: ``frames`` (uint8 [F, H, W, 3]) committed as given, or generated."""
        if self.table:
            raise ValueError("the rollout has already started")
        keys = [0] * self.model.spec.frames_per_chunk if keys is None else keys
        return self._commit_chunk(keys, frames)

    def step(self, keys: Sequence[int] | np.ndarray) -> np.ndarray:
        """Generate the next chunk for ``keys`` (one per frame); returns uint8 [F, H, W, 3]."""
        if not self.table:
            raise ValueError("call start() first")
        return self._commit_chunk(keys, None)

    @property
    def blocks_in_use(self) -> int:
        return self.blocks.num_used

    def checkpoint(self) -> RolloutCheckpoint:
        ids = [BlockId(b) for c in self.table for b in c]
        self.blocks.acquire(ids)
        return RolloutCheckpoint(tuple(self.table), self.gen.get_state(), self.prompt, self.carry, self.steps)

    def rollback(self, cp: RolloutCheckpoint) -> None:
        """Back to ``cp`` (which stays valid: roll back to it again, or :meth:`release` it)."""
        self.blocks.acquire(BlockId(b) for c in cp.table for b in c)
        self.blocks.free(BlockId(b) for c in self.table for b in c)
        self.table = list(cp.table)
        self.gen.set_state(cp.rng_state)
        self.prompt = cp.prompt
        self.carry = cp.carry
        self.steps = cp.steps

    def release(self, cp: RolloutCheckpoint) -> None:
        self.blocks.free(BlockId(b) for c in cp.table for b in c)
