"""``ChunkedWorldModel``: the project's world model behind the plug-in interface (interface.py).

Wraps a trained :class:`WorldTransformer` with the codec (patches), the prompt encoder (hashed
words -> learned embeddings -> per-layer cross-attention K/V, once per prompt version) and the
K/V contract: the pool stores each token's normalised, *un-rotated* key and its value;
:meth:`gather_context` copies the context's K/V out of the pool by block ids (a window-sized
tensor), rotates the keys by their positions in this context, and every denoise iteration of the
step reuses it; :meth:`commit` computes the clean chunk's K/V and writes them in place.

Numerics: ``eager`` runs the module as is; ``compiled`` runs its forward under
``torch.compile`` (the pool write stays outside the compiled graph, so the compiled code never
sees the pool). The two round differently, so the mode is part of :attr:`spec` (provenance).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import torch

from execstate.model.world import rope
from execstate.model.world.context_slots import context_slots
from execstate.model.world.interface import (
    NUMERICS_MODES,
    Carry,
    ChunkActions,
    ChunkKVLayout,
    ContextKV,
    KVWriter,
    PromptKV,
    WorldSpec,
)
from execstate.model.world.latent_codec import LatentCodec
from execstate.model.world.prompt import word_ids
from execstate.model.world.renderer import ACTIONS
from execstate.model.world.transformer import WorldTransformer
from execstate.model.world.weights import WEIGHTS_FILE, file_sha256, load_transformer
from execstate.state.kv_pool import KVPool


class ChunkedWorldModel:
    def __init__(self, net: WorldTransformer, weights_version: str, model_id: str = "world",
                 numerics: str = "eager") -> None:
        if numerics not in NUMERICS_MODES:
            raise ValueError(f"numerics must be one of {NUMERICS_MODES}, got {numerics!r}")
        cfg = net.cfg
        self.net, self.cfg = net, cfg
        self.codec = LatentCodec(cfg)
        f, p = cfg.frames_per_chunk, cfg.tokens_per_frame
        layout = ChunkKVLayout(cfg.n_layers, cfg.n_heads, cfg.head_dim, p, f, torch.float32)
        self.spec = WorldSpec(
            model_id=model_id, frame_shape=(cfg.frame_size, cfg.frame_size, 3), frames_per_chunk=f,
            keys=ACTIONS[: cfg.n_actions], camera_dim=cfg.camera_dim, schedule=cfg.schedule,
            chunk_latent_shape=(f, p, cfg.latent_dim), sink_chunks=cfg.sink_chunks,
            max_window_chunks=cfg.window_chunks, kv=layout, numerics=numerics, weights_version=weights_version)
        # compiled: shapes are dynamic (the context grows until the window is full), so one graph
        # serves every context length; denoise and commit (no output) are two graphs.
        self._forward = net.forward if numerics == "eager" else torch.compile(net.forward, dynamic=True)
        kv = self.spec.kv
        self._no_ctx = torch.zeros((kv.num_layers, 1, 0, kv.num_kv_heads, kv.head_dim))
        self._tables: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def load(cls, model_dir: Path | str, numerics: str = "eager", model_id: str = "world") -> ChunkedWorldModel:
        model_dir = Path(model_dir)
        return cls(load_transformer(model_dir), file_sha256(model_dir / WEIGHTS_FILE), model_id, numerics)

    # -- codec and conditioning -------------------------------------------------------------------

    def encode_frames(self, frames: np.ndarray) -> torch.Tensor:
        frames = np.asarray(frames)
        want = (self.cfg.frames_per_chunk, *self.spec.frame_shape)
        if frames.shape != want or frames.dtype != np.uint8:
            raise ValueError(f"a chunk of frames must be uint8{list(want)}, got {frames.dtype}{list(frames.shape)}")
        return self.codec.encode(frames)

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        return self.codec.decode(latents)

    @torch.no_grad()
    def encode_prompt(self, prompt: str, version: int) -> PromptKV:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"prompt version must be a non-negative int, got {version!r}")
        ids = torch.tensor([word_ids(prompt, self.cfg.text_buckets, self.cfg.max_prompt_words)])
        k, v = self.net.prompt_kv(ids)
        return PromptKV(version, prompt, k, v)

    def make_actions(self, keys: Sequence[int] | np.ndarray,
                     camera: Sequence[Sequence[float]] | None = None) -> ChunkActions:
        f = self.cfg.frames_per_chunk
        k = torch.as_tensor(np.asarray(keys, dtype=np.int64))
        if k.shape != (f,) or bool(((k < 0) | (k >= self.cfg.n_actions)).any()):
            raise ValueError(f"a chunk needs {f} keys in [0, {self.cfg.n_actions}), got {list(np.asarray(keys))}")
        cam = None
        if self.cfg.camera_dim:
            cam = torch.zeros((f, self.cfg.camera_dim)) if camera is None else torch.as_tensor(
                np.asarray(camera, dtype=np.float32))
            if cam.shape != (f, self.cfg.camera_dim) or not bool(torch.isfinite(cam).all()):
                raise ValueError(f"camera must be {f} x {self.cfg.camera_dim} finite deltas")
        elif camera is not None:
            raise ValueError("this world model has no camera (camera_dim = 0)")
        return ChunkActions(k, cam)

    # -- K/V ---------------------------------------------------------------------------------------

    def _rope(self, n_frames: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (n_frames, start)
        if key not in self._tables:
            pos = rope.token_frame_positions(n_frames, start, self.cfg.tokens_per_frame)
            self._tables[key] = rope.tables(pos, self.cfg.tokens_per_frame, self.cfg.head_dim)
        return self._tables[key]

    @torch.no_grad()
    def gather_context(self, pool: KVPool, chunks: Sequence[Sequence[int]]) -> ContextKV:
        key, slots = context_slots(self.spec, pool, chunks)
        if slots is None:
            return ContextKV(key, 0, None, None)
        n_frames = len(chunks) * self.cfg.frames_per_chunk
        cos, sin = self._rope(n_frames, 0)
        k = rope.rotate(pool.k.index_select(1, slots), cos, sin)
        v = pool.v.index_select(1, slots)
        return ContextKV(key, n_frames, k[:, None], v[:, None])

    def initial_carry(self) -> Carry:
        """Zeros: "no frames before" (what training shows the first chunk)."""
        return torch.zeros((self.cfg.carry_frames, *self.spec.chunk_latent_shape[1:]))

    def _run(self, x: torch.Tensor, t: float, actions: ChunkActions, prompt: PromptKV, ctx: ContextKV,
             carry: Carry, want_output: bool) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        if x.shape != self.spec.chunk_latent_shape:
            raise ValueError(f"chunk latents must have shape {self.spec.chunk_latent_shape}, got {tuple(x.shape)}")
        want = (self.cfg.carry_frames, *self.spec.chunk_latent_shape[1:])
        if carry.shape != want:
            raise ValueError(f"carry must have shape {want}, got {tuple(carry.shape)}")
        cos, sin = self._rope(cfg.frames_per_chunk, ctx.n_frames)
        tt = torch.full((1, 1), float(t))
        cam = None if actions.camera is None else actions.camera[None]
        ck = self._no_ctx if ctx.k is None else ctx.k
        cv = self._no_ctx if ctx.v is None else ctx.v
        with torch.no_grad():
            out = self._forward(x.reshape(1, cfg.tokens_per_chunk, cfg.latent_dim).to(torch.float32),
                                carry[None, None].to(torch.float32), tt,
                                actions.keys[None], cam, cos, sin, ck, cv, None, prompt.k, prompt.v, None,
                                want_output)
            return cast("tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]", out)  # K/V: not local_only

    def denoise_step(self, noisy: torch.Tensor, t: float, actions: ChunkActions, prompt: PromptKV,
                     ctx: ContextKV, carry: Carry) -> torch.Tensor:
        if not 0.0 <= t < 1.0:
            raise ValueError(f"flow time must be in [0, 1), got {t}")
        out, _, _ = self._run(noisy, t, actions, prompt, ctx, carry, want_output=True)
        assert out is not None  # want_output
        return self.codec.snap(out.reshape(self.spec.chunk_latent_shape))

    def commit(self, clean: torch.Tensor, actions: ChunkActions, prompt: PromptKV, ctx: ContextKV,
               carry: Carry, writer: KVWriter) -> Carry:
        """Writes the chunk's K/V; the next carry is the last ``carry_frames`` frames (a new tensor)."""
        if writer.pool.k.shape[0] != self.spec.kv.num_layers:
            raise ValueError("the writer's pool does not match the model's KV layout")
        _, k, v = self._run(clean, 1.0, actions, prompt, ctx, carry, want_output=False)
        writer.write(k[:, 0], v[:, 0])
        return torch.cat([carry, clean.detach().to(torch.float32)])[-self.cfg.carry_frames :].clone()
