"""The world-model plug-in interface: what a world model implements for the session runtime.

A world-model session advances one *chunk* of ``F`` frames per step. The runtime owns the state
(KV blocks and block tables, the prompt's cross-attention cache, the carry, the noise RNG,
events); the model is a pure function of its inputs and never allocates, frees or reorders
blocks.

Call order of one step (``sampler.generate_chunk`` is the reference implementation)::

    ctx = model.gather_context(pool, context_chunks)        # once per step; read-only view
    x = noise[0]                                            # noise: [S, *spec.chunk_latent_shape]
    for i, t in enumerate(spec.schedule):                   # S few-step iterations
        x1 = model.denoise_step(x, t, actions, prompt, ctx, carry)   # reads ctx, writes nothing
        if i + 1 < S:                                       # re-noise to the next flow time
            x = schedule[i+1] * x1 + (1 - schedule[i+1]) * noise[i+1]
    carry = model.commit(x1, actions, prompt, ctx, carry, writer)  # writes the new chunk's slots
    frames = model.decode(x1)                               # uint8 [F, H, W, 3]

then the runtime appends the new chunk's block ids to the session's block table and, with a
rolling window, releases the oldest middle chunks (``window.RollingWindow``): a block-table
operation, no tensor copy. A session that starts from frames (image-to-world) commits
``model.encode_frames(first_chunk)`` as its first chunk, without denoising.

The *carry* is the session's small recurrent state besides the K/V: what the next step needs
from this one that is not K/V (this model: the last two frames' latents, 54 KiB; a streaming VAE
decoder's feature cache would be carry too). A session starts with ``model.initial_carry()``;
the runtime keeps the carry with its control state and saves it in checkpoints (it is
immutable: a new one per step).

Contracts (each tested in tests/model/world/):

- ``denoise_step`` does not write the pool or any cached state (pool checksum unchanged);
  calling it twice with the same inputs gives the same output.
- ``commit`` writes the chunk's K/V in place (``index_copy_`` into the pool) at exactly the
  slots of ``writer.block_ids`` and nothing else; it allocates no temporary of pool size; it
  returns the next carry and leaves the given one unchanged.
- ``gather_context`` returns a copy of the context's K/V (window-sized, not pool-sized) that
  depends only on the K/V bytes of the listed blocks and their order: the same chunks held in
  other block ids give the same view (so rolling, checkpoints and restores into other slots
  are exact).
- ``encode_prompt(prompt, version)`` computes the cross-attention K/V once per prompt version.
  The prompt cache is separate from the frames' K/V: a prompt change (a new version) replaces
  it and leaves every committed chunk's K/V valid and untouched (docs/contracts.md 2, dependencies).
- Time positions are assigned within the context (``rope``), so the sink + window layout stays
  in the trained range however long a session runs; ``window_chunks`` must not exceed
  ``spec.max_window_chunks`` and the sink is ``spec.sink_chunks`` chunks.
- Outputs depend only on the inputs (weights, numerics mode, pool bytes, carry, noise): the
  runtime makes a step reproducible by restoring its block table, carry and RNG state.
- Bad input (wrong shapes, an action outside the key set, a block count that is not one
  chunk) raises ``ValueError`` before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from execstate.state.kv_pool import KVPool

NUMERICS_MODES = ("eager", "compiled")

Carry = torch.Tensor
"""A session's recurrent state besides the K/V (immutable; see the module docstring)."""


@dataclass(frozen=True)
class ChunkKVLayout:
    """The shape of one chunk's K/V in the pool (MHA: kv heads == heads)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    tokens_per_frame: int
    frames_per_chunk: int
    dtype: torch.dtype

    @property
    def tokens_per_chunk(self) -> int:
        return self.tokens_per_frame * self.frames_per_chunk

    def blocks_per_chunk(self, block_size: int) -> int:
        """Blocks one chunk occupies; a chunk must own whole blocks (so rolling frees whole blocks)."""
        if block_size < 1 or self.tokens_per_chunk % block_size:
            raise ValueError(f"block_size {block_size} does not divide the {self.tokens_per_chunk} tokens of a chunk")
        return self.tokens_per_chunk // block_size

    def bytes_per_chunk(self) -> int:
        item = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.tokens_per_chunk * self.num_kv_heads * self.head_dim * item


@dataclass(frozen=True)
class CameraRig:
    """A camera the session steers (``session/world/camera.py``): yaw and pitch in radians, a yaw
    rate per frame for each turn key while it is held, pitch clamped to ``+-pitch_limit``. A model
    with a rig takes ``ChunkActions.camera`` ``float32[F, 4]``: each frame's session-relative yaw and
    pitch and their change since the frame before."""

    turn_keys: tuple[tuple[str, float], ...]
    pitch_limit: float


@dataclass(frozen=True)
class WorldSpec:
    """What the runtime needs to know about a world model."""

    model_id: str
    frame_shape: tuple[int, int, int]  # (H, W, 3) uint8 frames
    frames_per_chunk: int
    keys: tuple[str, ...]  # discrete actions, index = key id ("none" first)
    camera_dim: int  # continuous camera deltas per frame; 0 when the world has no camera
    schedule: tuple[float, ...]  # flow times of the S denoise iterations (0 = noise, 1 = clean)
    chunk_latent_shape: tuple[int, ...]  # one chunk's latents (and each noise draw)
    sink_chunks: int
    max_window_chunks: int  # most chunks besides the sink a context may hold (trained range)
    kv: ChunkKVLayout
    numerics: str  # "eager" | "compiled" (goes into provenance)
    weights_version: str  # sha256 of the weights
    camera: CameraRig | None = None  # a steerable camera (then camera_dim == 4), else per-frame deltas if camera_dim
    world: str = "grid"  # the procedural world it was trained on (``scenes.py``: how its sessions start)
    scenes: tuple[int, ...] | None = None  # the scene seeds of that world it knows (None: any)


@dataclass(frozen=True)
class PromptKV:
    """Cross-attention K/V of one prompt version: ``k, v [n_layers, 1, n_words, H, Dh]``."""

    version: int
    prompt: str
    k: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True)
class ChunkActions:
    """One chunk's per-frame conditioning: ``keys int64[F]`` and ``camera float32[F, camera_dim]``
    (``None`` when the model has no camera)."""

    keys: torch.Tensor
    camera: torch.Tensor | None = None


@dataclass(frozen=True)
class ContextKV:
    """Read-only view of the context for one step: the gathered K/V (position-encoded for this
    layout) of ``chunks`` in order, sink first. ``n_frames``: the frames it covers (the new chunk's
    positions continue from there)."""

    chunks: tuple[tuple[int, ...], ...]
    n_frames: int
    k: torch.Tensor | None  # [n_layers, 1, n_tokens, H, Dh]; None for an empty context
    v: torch.Tensor | None


class KVWriter:
    """Where a commit writes: the new chunk's block ids in ``pool`` (validated on construction)."""

    def __init__(self, pool: KVPool, block_ids: Sequence[int], layout: ChunkKVLayout) -> None:
        ids = [int(b) for b in block_ids]
        need = layout.blocks_per_chunk(pool.block_size)
        if len(ids) != need:
            raise ValueError(f"a chunk needs {need} blocks of {pool.block_size} tokens, got {len(ids)}")
        if len(set(ids)) != len(ids) or any(not 0 <= b < pool.num_blocks for b in ids):
            raise ValueError(f"block ids must be distinct and in [0, {pool.num_blocks}), got {ids}")
        self.pool = pool
        self.block_ids = tuple(ids)
        bs = pool.block_size
        self.slots = (torch.tensor(ids)[:, None] * bs + torch.arange(bs)[None, :]).reshape(-1)

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """``k, v [n_layers, tokens_per_chunk, H, Dh]`` into the chunk's slots, in place, per layer."""
        for layer in range(k.shape[0]):
            self.pool.write(layer, self.slots, k[layer], v[layer])


@runtime_checkable
class WorldModel(Protocol):
    """A chunked autoregressive latent-video model (Self-Forcing / CausVid / Matrix-Game shape)."""

    spec: WorldSpec

    def encode_frames(self, frames: np.ndarray) -> torch.Tensor:
        """``uint8[F, H, W, 3]`` -> one chunk's clean latents (``spec.chunk_latent_shape``)."""

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """One chunk's latents -> ``uint8[F, H, W, 3]``."""

    def encode_prompt(self, prompt: str, version: int) -> PromptKV:
        """The prompt's cross-attention K/V, computed once per version (cache it by version)."""

    def make_actions(self, keys: Sequence[int] | np.ndarray,
                     camera: Sequence[Sequence[float]] | None = None) -> ChunkActions:
        """Validate one chunk's actions (``F`` keys, ``F x camera_dim`` deltas) -> ChunkActions."""

    def gather_context(self, pool: KVPool, chunks: Sequence[Sequence[int]]) -> ContextKV:
        """Read the listed chunks' K/V (block ids per chunk, sink first) into a view for one step."""

    def initial_carry(self) -> Carry:
        """The carry of a session before its first chunk."""

    def denoise_step(self, noisy: torch.Tensor, t: float, actions: ChunkActions, prompt: PromptKV,
                     ctx: ContextKV, carry: Carry) -> torch.Tensor:
        """Predict the clean chunk from ``noisy`` at flow time ``t``; attends to ``ctx``, writes nothing."""

    def commit(self, clean: torch.Tensor, actions: ChunkActions, prompt: PromptKV, ctx: ContextKV,
               carry: Carry, writer: KVWriter) -> Carry:
        """Run the clean chunk once, write its K/V through ``writer`` (in place); the next carry."""
