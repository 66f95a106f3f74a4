"""Rolling self-forcing for the maze model: train on the model's own long rollouts.

``n`` environments run in lock step, each a session of the model on a trajectory of the renderer
(the same keys and camera): its K/V in its own pool with the session's rolling window, its carry
the model's own last frame. Each training step, every environment's next chunk is predicted *with
gradients* from its cached context (the model's own earlier chunks, as at serving time; the context
K/V is not differentiated, as in Self-Forcing) and compared with the renderer's frames at the true
pose; then the prediction (detached) is committed, as a session commits it, and the environment
moves on. So the model is trained on the states its own rollouts reach hundreds of frames in, and
is taught to pull a drifting view back to the world instead of compounding its errors (the
targets are always the renderer's). After ``length`` chunks, an environment restarts in a new maze.

Re-anchoring (``advance(p_truth=...)``): a chunk is committed from the renderer instead of the
model with probability ``p_truth``. Trained on its deep rollouts alone, with the renderer's frames
as targets, the model learnt to hedge: once its rollout has drifted from the world the target is
unpredictable from the context, and the frame that minimises the squared error is a blur (a first
run of 1,500 such steps ended predicting a near-uniform frame, 20.8 dB, SSIM 0.55). Mixing in the
world's chunks keeps most contexts a few of the model's own chunks away from the world: errors it
can learn to correct.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from execstate.model.world.interface import KVWriter
from execstate.model.world.maze import positions
from execstate.model.world.maze.model import MazeWorldModel
from execstate.model.world.maze.network import MazeNet
from execstate.model.world.maze.pose import DTHETA
from execstate.model.world.rope import token_frame_positions
from execstate.model.world.window import RollingWindow
from execstate.state.block_pool import BlockId, BlockPool
from execstate.state.kv_pool import KVPool
from execstate_bench.world_tools.maze_data import Trajectory, random_trajectory
from execstate_bench.world_tools.maze_teacher import prompt_ids, to_unit


class _Env:
    def __init__(self, model: MazeWorldModel, traj: Trajectory) -> None:
        spec, cfg = model.spec, model.cfg
        self.traj = traj
        self.window = RollingWindow(cfg.sink_chunks, cfg.window_chunks)
        self.bpc = spec.kv.blocks_per_chunk(cfg.tokens_per_frame)
        n_blocks = (self.window.max_chunks + 1) * self.bpc
        kv = spec.kv
        self.kv = KVPool(kv.num_layers, n_blocks, cfg.tokens_per_frame, kv.num_kv_heads, kv.head_dim, kv.dtype)
        self.blocks = BlockPool(n_blocks)
        self.table: list[tuple[int, ...]] = []
        self.prompt = model.encode_prompt(traj.prompt, 0)
        self.carry = model.initial_carry()
        self.chunk = 0


class RollingEnvs:
    def __init__(self, net: MazeNet, n: int, length: int, rng: np.random.Generator) -> None:
        self.net, self.n, self.length, self.rng = net, n, length, rng
        self.model = MazeWorldModel(net, "training")
        self.envs: list[_Env] = []

    def _actions(self, env: _Env, c: int):  # noqa: ANN202 - ChunkActions
        f = self.net.cfg.frames_per_chunk
        keys, camera = env.traj.keys[c * f : (c + 1) * f], env.traj.camera[c * f : (c + 1) * f]  # arrays, as rows
        return self.model.make_actions(cast("Sequence[int]", keys), cast("Sequence[Sequence[float]]", camera))

    @torch.no_grad()
    @torch.autocast("cpu", enabled=False)  # as a session commits: fp32 K/V in the pool
    def _commit(self, env: _Env, frames: torch.Tensor) -> None:
        frames = frames.float()
        ctx = self.model.gather_context(env.kv, self.window_context(env))
        ids = env.blocks.allocate(env.bpc)
        env.carry = self.model.commit(frames, self._actions(env, env.chunk), env.prompt, ctx, env.carry,
                                      KVWriter(env.kv, ids, self.model.spec.kv))
        env.table.append(tuple(ids))
        env.table, released = env.window.roll(env.table)
        env.blocks.free(BlockId(b) for b in released)
        env.chunk += 1

    @staticmethod
    def window_context(env: _Env) -> list[tuple[int, ...]]:
        return env.window.context(env.table)

    @torch.autocast("cpu", enabled=False)
    def reset(self) -> None:
        """New trajectories; each environment starts as a session does: its first chunk rendered."""
        f = self.net.cfg.frames_per_chunk
        self.envs = []
        for _ in range(self.n):
            traj = random_trajectory(self.rng, self.length * f, f)
            env = _Env(self.model, traj)
            self._commit(env, to_unit(traj.frames(0, f)))
            self.envs.append(env)

    def predict(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every environment's next chunk, with gradients (``[n, F, H, W, 3]``), and the renderer's."""
        if not self.envs or self.envs[0].chunk >= self.length:
            self.reset()
        cfg = self.net.cfg
        f, p = cfg.frames_per_chunk, cfg.tokens_per_frame
        ctxs = [self.model.gather_context(e.kv, self.window_context(e)) for e in self.envs]
        c = self.envs[0].chunk
        keys = torch.stack([torch.from_numpy(e.traj.keys[c * f : (c + 1) * f]) for e in self.envs])
        cam = torch.stack([torch.from_numpy(e.traj.camera[c * f : (c + 1) * f]) for e in self.envs])
        pos = token_frame_positions(f, ctxs[0].n_frames, p)
        ang = positions.strip_angles(cam[:, :, 0], p, cfg.strip, DTHETA)
        cos, sin = positions.both_tables(pos.expand(self.n, -1), ang, cfg.head_dim, cfg.time_pairs)
        ids, mask = prompt_ids([e.traj.prompt for e in self.envs], cfg)
        pk, pv = self.net.prompt_kv(ids)
        assert all(x.k is not None and x.v is not None for x in ctxs)  # every env has context K/V here
        ck = torch.cat([cast(torch.Tensor, x.k) for x in ctxs], dim=1)
        cv = torch.cat([cast(torch.Tensor, x.v) for x in ctxs], dim=1)
        carry = torch.stack([e.carry for e in self.envs])[:, None]
        x = torch.zeros((self.n, 1, f, cfg.frame_size, cfg.frame_size, 3))
        out, _, _ = self.net(x, carry, torch.zeros((self.n, 1)), keys[:, None], cam[:, None], cos, sin, ck, cv, None,
                             pk, pv, mask)
        truth = torch.stack([to_unit(e.traj.frames(c * f, (c + 1) * f)) for e in self.envs])
        return out[:, 0], truth

    def advance(self, frames: torch.Tensor, p_truth: float = 0.0) -> None:
        """Commit each environment's chunk: the model's own prediction (detached), or with
        probability ``p_truth`` the renderer's (re-anchoring: the rollouts stay near the world, so
        the target stays predictable from the context and the model learns to correct its own
        recent errors instead of hedging towards a mean frame)."""
        f = self.net.cfg.frames_per_chunk
        for env, fr in zip(self.envs, frames.detach().clamp(-1, 1), strict=True):
            if p_truth > 0 and self.rng.random() < p_truth:
                c = env.chunk
                fr = to_unit(env.traj.frames(c * f, (c + 1) * f))
            self._commit(env, fr)
