"""``MazeStateModel``: the maze state model (``network.py``) behind the plug-in interface
(``model/world/interface.py``), as the session runtime runs it.

Latents are the frames (RGB in ``[-1, 1]``, ``[F, H, W, 3]``, as the pixel maze model's,
``maze/chunk_io.py``). The carry is the state (``network.py``): the walker's position on the plan,
the maze's yaw at the session's yaw 0, and whether it is located. A step does not denoise: the
chunk is the view from the poses the motion reaches (``schedule`` is ``(0.0,)``, one call, the
noise unused), so the frames are a function of the carry, the actions and the theme.

- ``denoise_step``: the motion from the carry's position through the chunk's keys, at the yaws of
  the camera, then the view from each frame's pose (a carry not yet located starts from the home
  pose: a session that starts from nothing);
- ``commit``: the same motion (or, from a carry not yet located, the pose the chunk's last frame
  was seen from: ``locate.py``, a session that starts from frames), its state tokens into the
  chunk's slots (``writer``), and the new carry;
- ``gather_context``: the context's tokens out of the pool (a copy, by block ids, in order).

K/V: one state token per frame, one layer, one head of ``token_dim`` (``motion.py``): the session's
cache holds the walker's path over the window; the model's steps do not read it (the state is
Markov). The prompt's
"K/V" is its theme (``textures.theme_for_prompt``: the word of the prompt the renderer reads),
as an index into the learnt theme embeddings. Numerics: ``eager`` runs the chunk as is;
``compiled`` runs the view (the frames: where the time goes) under ``torch.compile`` and the
motion and state tokens (``StateNet.state_step``) as eager does, so both modes carry the same
state and write the same K/V, bit for bit. Compiled, the state step's K/V came out up to a few
1e-8 apart: inductor fuses the tokens' features into one C++ loop that calls the C library's
``std::cos`` / ``std::sin`` of the yaw where eager's ``torch.cos`` / ``torch.sin`` run ATen's
vectorised (Sleef) ones, a last-bit difference the token layer passes on (the layer itself is the
same ``addmm`` in both, and the motion's positions were equal).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

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
from execstate.model.world.maze import chunk_io
from execstate.model.world.maze.model import RIG
from execstate.model.world.maze.pose import KEYS
from execstate.model.world.maze.state.config import StateModelConfig
from execstate.model.world.maze.state.locate import locate
from execstate.model.world.maze.state.network import StateNet
from execstate.model.world.maze.textures import theme_for_prompt
from execstate.model.world.weights import WEIGHTS_FILE, file_sha256, load_module
from execstate.state.kv_pool import KVPool

LOCATED = 3  # the carry's index of the "located" flag
LOCATED_CACHE = 64  # frames whose located pose a model keeps


class MazeStateModel:
    def __init__(self, net: StateNet, weights_version: str, model_id: str = "maze", numerics: str = "eager") -> None:
        if numerics not in NUMERICS_MODES:
            raise ValueError(f"numerics must be one of {NUMERICS_MODES}, got {numerics!r}")
        cfg = net.cfg
        self.net, self.cfg = net, cfg
        f = cfg.frames_per_chunk
        layout = ChunkKVLayout(1, 1, cfg.token_dim, 1, f, torch.float32)
        self.spec = WorldSpec(
            model_id=model_id, frame_shape=(cfg.frame_size, cfg.frame_size, 3), frames_per_chunk=f,
            keys=KEYS[: cfg.n_keys], camera_dim=4, schedule=(0.0,),
            chunk_latent_shape=(f, cfg.frame_size, cfg.frame_size, 3), sink_chunks=cfg.sink_chunks,
            max_window_chunks=cfg.window_chunks, kv=layout, numerics=numerics, weights_version=weights_version,
            camera=RIG, world="maze", scenes=(cfg.maze_seed,))
        self._frames = net.view.frames if numerics == "eager" else torch.compile(net.view.frames, dynamic=True)
        self._located: dict[tuple[str, int, float, float], tuple[float, float, float]] = {}

    @classmethod
    def load(cls, model_dir: Path | str, numerics: str = "eager", model_id: str = "maze") -> MazeStateModel:
        model_dir = Path(model_dir)
        net = load_module(model_dir, StateModelConfig, StateNet)
        return cls(net, file_sha256(model_dir / WEIGHTS_FILE), model_id, numerics)

    # -- codec and conditioning -------------------------------------------------------------------
    def encode_frames(self, frames: np.ndarray) -> torch.Tensor:
        return chunk_io.encode_frames(self.spec, frames)

    def decode(self, latents: torch.Tensor) -> np.ndarray:
        return chunk_io.decode(self.spec, latents)

    def encode_prompt(self, prompt: str, version: int) -> PromptKV:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"prompt version must be a non-negative int, got {version!r}")
        theme = torch.tensor([float(self.cfg.themes.index(theme_for_prompt(prompt)))])
        return PromptKV(version, prompt, theme, theme.clone())

    def make_actions(self, keys: Sequence[int], camera: Sequence[Sequence[float]] | None = None) -> ChunkActions:
        return chunk_io.make_actions(self.spec, keys, camera)

    # -- K/V ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def gather_context(self, pool: KVPool, chunks: Sequence[Sequence[int]]) -> ContextKV:
        key, slots = context_slots(self.spec, pool, chunks)
        if slots is None:
            return ContextKV(key, 0, None, None)
        n_frames = len(chunks) * self.cfg.frames_per_chunk
        return ContextKV(key, n_frames, pool.k.index_select(1, slots)[:, None], pool.v.index_select(1, slots)[:, None])

    def initial_carry(self) -> Carry:
        """Not located yet (``network.py``)."""
        return torch.zeros(4)

    # -- steps -------------------------------------------------------------------------------------
    def _check(self, x: torch.Tensor, carry: Carry) -> None:
        if tuple(x.shape) != self.spec.chunk_latent_shape:
            raise ValueError(f"chunk latents must have shape {self.spec.chunk_latent_shape}, got {tuple(x.shape)}")
        if tuple(carry.shape) != (4,) or not bool(torch.isfinite(carry).all()):
            raise ValueError(f"carry must be 4 finite numbers (x, z, yaw, located), got {tuple(carry.shape)}")

    def _theme(self, prompt: PromptKV) -> torch.Tensor:
        return prompt.k.to(torch.long).reshape(1)

    def _run(self, state: torch.Tensor, actions: ChunkActions, prompt: PromptKV, render: bool
             ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
        cam = actions.camera if actions.camera is not None else torch.zeros((self.cfg.frames_per_chunk, 4))
        with torch.no_grad():
            xz, yaw, k, v = self.net.state_step(state, actions.keys, cam)  # eager in both modes (docstring)
            frames = None
            if render:
                frames = self._frames(xz[:, 0], xz[:, 1], yaw, cam[:, 1], self._theme(prompt).expand(xz.shape[0]))
            return frames, xz, k, v

    def _start(self, carry: Carry) -> torch.Tensor:
        if float(carry[LOCATED]) > 0.5:
            return carry
        return torch.tensor([self.cfg.home_x, self.cfg.home_z, self.cfg.home_yaw, 1.0])

    def denoise_step(self, noisy: torch.Tensor, t: float, actions: ChunkActions, prompt: PromptKV,
                     ctx: ContextKV, carry: Carry) -> torch.Tensor:
        if not 0.0 <= t < 1.0:
            raise ValueError(f"flow time must be in [0, 1), got {t}")
        self._check(noisy, carry)
        frames, _, _, _ = self._run(self._start(carry), actions, prompt, render=True)
        assert frames is not None  # render
        return frames.clamp(-1.0, 1.0)

    @torch.no_grad()
    def locate(self, frame: torch.Tensor, theme: int, pitch: float, session_yaw: float = 0.0
               ) -> tuple[float, float, float]:
        """The pose ``(x, z, maze yaw)`` a frame ``[H, W, 3]`` at the session's yaw ``session_yaw``
        was seen from (``locate.py``; the search costs about ten frames' rendering, so the answers
        for the last ``LOCATED_CACHE`` frames are kept: every session of a scene starts from the
        same frames)."""
        key = (hashlib.sha256(frame.to(torch.float32).numpy().tobytes()).hexdigest(), theme, pitch, session_yaw)
        found = self._located.get(key)
        if found is None:
            home = (self.cfg.home_x, self.cfg.home_z, self.cfg.home_yaw + session_yaw)
            found = locate(self.net.view, frame, theme, pitch, home)
            if len(self._located) >= LOCATED_CACHE:
                self._located.pop(next(iter(self._located)))
            self._located[key] = found
        return found

    def commit(self, clean: torch.Tensor, actions: ChunkActions, prompt: PromptKV, ctx: ContextKV,
               carry: Carry, writer: KVWriter) -> Carry:
        """Writes the chunk's state tokens; the next carry is the state after the chunk's last frame."""
        self._check(clean, carry)
        if writer.pool.k.shape[0] != self.spec.kv.num_layers:
            raise ValueError("the writer's pool does not match the model's KV layout")
        cam = actions.camera if actions.camera is not None else torch.zeros((self.cfg.frames_per_chunk, 4))
        state = carry
        if float(carry[LOCATED]) <= 0.5:
            x, z, yaw = self.locate(clean[-1].to(torch.float32), int(self._theme(prompt)), float(cam[-1, 1]),
                                    float(cam[-1, 0]))
            keep = torch.zeros_like(actions.keys)  # located at the last frame: the chunk does not move
            state = torch.tensor([x, z, yaw - float(cam[-1, 0]), 1.0])
            actions = ChunkActions(keep, cam)
        _, xz, k, v = self._run(state, actions, prompt, render=False)
        writer.write(k[None, :, None], v[None, :, None])
        return torch.cat([xz[-1], state[2:3], torch.ones(1)]).to(torch.float32)
