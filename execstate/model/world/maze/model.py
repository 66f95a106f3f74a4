"""``MazeWorldModel``: the maze world model behind the plug-in interface (``model/world/interface.py``).

Latents are the frames themselves (RGB in ``[-1, 1]``, ``[F, H, W, 3]`` per chunk); a token is a
vertical strip (``network.py``). The camera reaches the model as ``ChunkActions.camera``
``float32[F, 4]``: each frame's session-relative yaw and pitch and their change since the frame
before, which the session runtime integrates from camera events and turn keys
(``session/world/camera.py``, with the rig of :attr:`spec`).

K/V contract: the pool stores each token's normalised key *rotated by its world angle*
(``positions.py``: fixed once the frame is committed) and its value; :meth:`gather_context` copies
the context's K/V out of the pool by block ids and rotates the keys by their time positions in this
context; :meth:`commit` computes the clean chunk's K/V, rotates the keys by angle and writes them in
place. Numerics: ``eager`` runs the module as is; ``compiled`` under ``torch.compile`` (the pool
write stays outside the compiled graph).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from execstate.model.world.context_slots import context_slots
from execstate.model.world.interface import (
    NUMERICS_MODES,
    CameraRig,
    Carry,
    ChunkActions,
    ChunkKVLayout,
    ContextKV,
    KVWriter,
    PromptKV,
    WorldSpec,
)
from execstate.model.world.maze import chunk_io, positions
from execstate.model.world.maze.network import MazeNet
from execstate.model.world.maze.pose import DTHETA, KEYS, PITCH_LIMIT, TURN_KEYS
from execstate.model.world.maze.weights import WEIGHTS_FILE, file_sha256, load_net
from execstate.model.world.prompt import word_ids
from execstate.model.world.rope import rotate, token_frame_positions
from execstate.state.kv_pool import KVPool

RIG = CameraRig(turn_keys=tuple(sorted(TURN_KEYS.items())), pitch_limit=PITCH_LIMIT)


class MazeWorldModel:
    def __init__(self, net: MazeNet, weights_version: str, model_id: str = "maze", numerics: str = "eager") -> None:
        if numerics not in NUMERICS_MODES:
            raise ValueError(f"numerics must be one of {NUMERICS_MODES}, got {numerics!r}")
        cfg = net.cfg
        self.net, self.cfg = net, cfg
        f, p = cfg.frames_per_chunk, cfg.tokens_per_frame
        layout = ChunkKVLayout(cfg.n_layers, cfg.n_heads, cfg.head_dim, p, f, torch.float32)
        self.spec = WorldSpec(
            model_id=model_id, frame_shape=(cfg.frame_size, cfg.frame_size, 3), frames_per_chunk=f,
            keys=KEYS[: cfg.n_keys], camera_dim=4, schedule=cfg.schedule,
            chunk_latent_shape=(f, cfg.frame_size, cfg.frame_size, 3), sink_chunks=cfg.sink_chunks,
            max_window_chunks=cfg.window_chunks, kv=layout, numerics=numerics, weights_version=weights_version,
            camera=RIG, world="maze")
        self._forward = net.forward if numerics == "eager" else torch.compile(net.forward, dynamic=True)
        self._no_ctx = torch.zeros((cfg.n_layers, 1, 0, cfg.n_heads, cfg.head_dim))

    @classmethod
    def load(cls, model_dir: Path | str, numerics: str = "eager", model_id: str = "maze") -> MazeWorldModel:
        model_dir = Path(model_dir)
        return cls(load_net(model_dir), file_sha256(model_dir / WEIGHTS_FILE), model_id, numerics)

    # -- codec and conditioning -------------------------------------------------------------------
    def encode_frames(self, frames: np.ndarray) -> torch.Tensor:
        return chunk_io.encode_frames(self.spec, frames)

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        return chunk_io.decode(self.spec, latents)

    @torch.no_grad()
    def encode_prompt(self, prompt: str, version: int) -> PromptKV:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"prompt version must be a non-negative int, got {version!r}")
        ids = torch.tensor([word_ids(prompt, self.cfg.text_buckets, self.cfg.max_prompt_words)])
        k, v = self.net.prompt_kv(ids)
        return PromptKV(version, prompt, k, v)

    def make_actions(self, keys: Sequence[int], camera: Sequence[Sequence[float]] | None = None) -> ChunkActions:
        """``keys``: F key ids; ``camera``: F rows of (yaw, pitch, change of yaw, change of pitch) in
        radians (None: all zero, a session that never turned)."""
        return chunk_io.make_actions(self.spec, keys, camera)

    # -- K/V ---------------------------------------------------------------------------------------
    def _angles(self, camera: torch.Tensor) -> torch.Tensor:
        return positions.strip_angles(camera[:, 0], self.cfg.tokens_per_frame, self.cfg.strip, DTHETA)

    @torch.no_grad()
    def gather_context(self, pool: KVPool, chunks: Sequence[Sequence[int]]) -> ContextKV:
        cfg = self.cfg
        key, slots = context_slots(self.spec, pool, chunks)
        if slots is None:
            return ContextKV(key, 0, None, None)
        n_frames = len(chunks) * cfg.frames_per_chunk
        cos, sin = positions.time_tables(token_frame_positions(n_frames, 0, cfg.tokens_per_frame), cfg.head_dim,
                                         cfg.time_pairs)
        k = rotate(pool.k.index_select(1, slots), cos, sin)
        return ContextKV(key, n_frames, k[:, None], pool.v.index_select(1, slots)[:, None])

    def initial_carry(self) -> Carry:
        """A black frame: "nothing before" (sessions of this world start from rendered frames)."""
        return torch.full(self.spec.frame_shape, -1.0)

    def _run(self, x: torch.Tensor, t: float, actions: ChunkActions, prompt: PromptKV, ctx: ContextKV,
             carry: Carry, want_output: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        cfg = self.cfg
        if tuple(x.shape) != self.spec.chunk_latent_shape:
            raise ValueError(f"chunk latents must have shape {self.spec.chunk_latent_shape}, got {tuple(x.shape)}")
        if tuple(carry.shape) != self.spec.frame_shape:
            raise ValueError(f"carry must have shape {self.spec.frame_shape}, got {tuple(carry.shape)}")
        cam = actions.camera if actions.camera is not None else torch.zeros((cfg.frames_per_chunk, 4))
        pos = token_frame_positions(cfg.frames_per_chunk, ctx.n_frames, cfg.tokens_per_frame)
        cos, sin = positions.both_tables(pos, self._angles(cam), cfg.head_dim, cfg.time_pairs)
        ck = self._no_ctx if ctx.k is None else ctx.k
        cv = self._no_ctx if ctx.v is None else ctx.v
        with torch.no_grad():
            return self._forward(x[None, None].to(torch.float32), carry[None, None].to(torch.float32),
                                 torch.full((1, 1), float(t)), actions.keys[None, None], cam[None, None], cos, sin,
                                 ck, cv, None, prompt.k, prompt.v, None, want_output)

    def denoise_step(self, noisy: torch.Tensor, t: float, actions: ChunkActions, prompt: PromptKV,
                     ctx: ContextKV, carry: Carry) -> torch.Tensor:
        if not 0.0 <= t < 1.0:
            raise ValueError(f"flow time must be in [0, 1), got {t}")
        out, _, _ = self._run(noisy, t, actions, prompt, ctx, carry, want_output=True)
        assert out is not None  # want_output
        return out[0, 0].clamp(-1.0, 1.0)

    def commit(self, clean: torch.Tensor, actions: ChunkActions, prompt: PromptKV, ctx: ContextKV,
               carry: Carry, writer: KVWriter) -> Carry:
        """Writes the chunk's K/V (keys rotated by angle); the next carry is the chunk's last frame."""
        if writer.pool.k.shape[0] != self.spec.kv.num_layers:
            raise ValueError("the writer's pool does not match the model's KV layout")
        _, k, v = self._run(clean, 1.0, actions, prompt, ctx, carry, want_output=False)
        assert k is not None and v is not None  # not local_only: the blocks ran
        cam = actions.camera if actions.camera is not None else torch.zeros((self.cfg.frames_per_chunk, 4))
        cos, sin = positions.angle_tables(self._angles(cam), self.cfg.head_dim, self.cfg.time_pairs)
        writer.write(rotate(k[:, 0], cos, sin), v[:, 0])
        return clean[-1].detach().to(torch.float32).clone()
