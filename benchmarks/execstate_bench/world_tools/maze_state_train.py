"""Train the maze state model (``execstate/model/world/maze/state/``) on the raycaster of one maze,
deterministically from a seed, with checkpoints: ``python -m execstate_bench.world_tools.maze_state_train
--out runs/maze-state`` (flags: ``--help``).

Data (``maze_state_data.py``): ``views`` frames at random poses with each column's wall distance,
``walks`` of the player-like policy through the world's physics (poses only), and
``clearance_points`` points of the plan with the walker's clearance there (the distance from its
disc to the nearest wall or object). The renderer's poses, depths and clearances supervise
training only; the model never sees them at inference. Two stages, Adam, cosine decay within each
stage:

1. ``view_steps``: the view (the maps and the pixel MLP): random columns of random views, all their
   rows; loss = MSE of the pixels in ``[-1, 1]`` + ``depth_weight`` x MSE of the log depth.
2. ``motion_steps``: the motion: the free-space map by regression on the clearance at
   ``clearance_batch`` random points (``clearance_weight`` x MSE, clearances above 1 cell clipped: the
   map's value is the clearance, > 0 free), and the steps by regression on the walks' moves (at the
   walk's true poses, gated by whether the walker moved). ``walk_map_weight`` > 0 adds the recipe
   before the clearance, which trained the map from the walks alone: batches of walks run chunk by
   chunk through the hard gates (a sigmoid's gradient through them), each chunk from the walk's
   pose at its start (``reanchor``; 0: from where the model's own walk got to), the MSE of the
   chunks' positions against the walk's, and the gates' cross-entropy against whether the walker
   moved along each axis and against "free" where it stood. That map was wrong on 8 % of single
   steps (it let the walker into the band a wall's disc-width in front of it), the clearance's on
   0.3 % (docs/world-maze.md); ``reanchor 0`` made the loss grow.

After the motion stage, ``train.json`` gets the motion's one-step error over the walks: the
fraction of frames whose position after one step from the true pose is off by more than 0.01 cell.

Every ``checkpoint_every`` steps the state (weights, optimizer, stage, step, the batch generator)
goes to ``out/checkpoint.pt``; ``--resume`` continues from it (the data is re-made from the seed).
The result: ``model.safetensors``, ``config.json`` and ``train.json`` (configs, losses, wall and
CPU time, machine load, the weights' sha256).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F

from execstate.model.world.maze import layout, pose
from execstate.model.world.maze.state.config import StateModelConfig
from execstate.model.world.maze.state.motion import Motion
from execstate.model.world.maze.state.network import StateNet
from execstate.model.world.weights import WEIGHTS_FILE, save_weights
from execstate_bench.world_tools import maze_state_data

CHECKPOINT = "checkpoint.pt"
STAGES = ("view", "motion")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    views: int = 6000
    walks: int = 2048
    walk_frames: int = 64
    view_steps: int = 4000
    view_frames: int = 16  # views per batch
    view_columns: int = 32  # columns per view
    depth_weight: float = 0.5
    map_lr: float = 0.02
    mlp_lr: float = 1e-2
    motion_steps: int = 4000
    motion_batch: int = 128
    motion_lr: float = 0.05
    clearance_points: int = 262144
    clearance_batch: int = 16384
    clearance_weight: float = 100.0
    walk_map_weight: float = 0.0  # the walks' losses on the map (the recipe before the clearance: 1.0)
    reanchor: int = 1  # 1: each chunk starts from the walk's pose; 0: from the unrolled one (it spoilt the map)
    step_lr: float = 0.005
    checkpoint_every: int = 200


def _cosine(base: float, step: int, total: int) -> float:
    return base * 0.5 * (1.0 + math.cos(math.pi * step / max(1, total)))


class Trainer:
    def __init__(self, tc: TrainConfig, mc: StateModelConfig, out: Path) -> None:
        self.tc, self.mc, self.out = tc, mc, out
        torch.manual_seed(tc.seed)
        self.net = StateNet(mc)
        maze = layout.generate(mc.maze_seed)
        rng = np.random.default_rng(tc.seed)
        v = maze_state_data.views(maze, rng, tc.views)
        self.frames = torch.from_numpy(v.frames).to(torch.float32) / 127.5 - 1.0
        self.depth = torch.from_numpy(v.depth).clamp(max=mc.ray_far)
        self.pose = torch.from_numpy(v.pose)
        self.theme = torch.from_numpy(v.theme)
        w = maze_state_data.walks(maze, rng, tc.walks, tc.walk_frames)
        self.keys, self.yaw, self.xz = torch.from_numpy(w.keys), torch.from_numpy(w.yaw), torch.from_numpy(w.xz)
        c = maze_state_data.clearances(maze, rng, tc.clearance_points)
        self.points, self.clearance = torch.from_numpy(c.xz), torch.from_numpy(c.clearance).clamp(max=1.0)
        self.gen = torch.Generator().manual_seed(tc.seed)
        self.stage, self.step = 0, 0
        self.losses: dict[str, list[float]] = {s: [] for s in STAGES}
        self.opt = self._optimizer()

    def _optimizer(self) -> torch.optim.Optimizer:
        n, tc = self.net, self.tc
        if STAGES[self.stage] == "view":
            return torch.optim.Adam([{"params": [n.view.density, n.view.appearance, n.view.surface], "lr": tc.map_lr},
                                     {"params": [*n.view.mlp.parameters(), *n.view.theme.parameters()],
                                      "lr": tc.mlp_lr}])
        rest = [p for name, p in n.motion.named_parameters() if name != "steps"]
        return torch.optim.Adam([{"params": rest, "lr": tc.motion_lr}, {"params": [n.motion.steps], "lr": tc.step_lr}])

    # -- stages ------------------------------------------------------------------------------------
    def view_loss(self) -> torch.Tensor:
        tc, size = self.tc, self.mc.frame_size
        idx = torch.randint(0, len(self.frames), (tc.view_frames,), generator=self.gen)
        cols = torch.randint(0, size, (tc.view_frames, tc.view_columns), generator=self.gen)
        p = self.pose[idx]
        angles = p[:, 2:3] + (cols.to(torch.float32) + 0.5 - size / 2) * pose.DTHETA
        pix, depth = self.net.view.columns(p[:, 0], p[:, 1], angles, p[:, 3], self.theme[idx])
        target = torch.gather(self.frames[idx], 2, cols[:, None, :, None].expand(-1, size, -1, 3))
        true_depth = torch.gather(self.depth[idx], 1, cols)
        log_err = torch.log(depth + 0.1) - torch.log(true_depth + 0.1)
        return F.mse_loss(pix, target) + tc.depth_weight * (log_err**2).mean()

    def motion_loss(self) -> torch.Tensor:
        tc, motion = self.tc, self.net.motion
        idx = torch.randint(0, len(self.keys), (tc.motion_batch,), generator=self.gen)
        keys, yaw, xz = self.keys[idx], self.yaw[idx], self.xz[idx]
        # the steps against the moves at the walk's true poses, gated by what happened
        before, after = xz[:, :-1], xz[:, 1:]
        dx, dz = motion.displacement(yaw, keys)
        moved_x = ((after[..., 0] - before[..., 0]).abs() > 1e-6).to(torch.float32)
        moved_z = ((after[..., 1] - before[..., 1]).abs() > 1e-6).to(torch.float32)
        moves = torch.stack([dx * moved_x, dz * moved_z], dim=-1)
        loss = 100.0 * F.mse_loss(moves, after - before)
        # the map: the walker's clearance at random points of the plan
        pts = torch.randint(0, len(self.points), (tc.clearance_batch,), generator=self.gen)
        p = self.points[pts]
        loss = loss + tc.clearance_weight * F.mse_loss(motion.free_logit(p[:, 0], p[:, 1]), self.clearance[pts])
        if tc.walk_map_weight > 0:
            loss = loss + tc.walk_map_weight * self.walk_map_loss(keys, yaw, xz, dx, dz, moved_x, moved_z)
        return loss

    def walk_map_loss(self, keys: torch.Tensor, yaw: torch.Tensor, xz: torch.Tensor, dx: torch.Tensor,
                      dz: torch.Tensor, moved_x: torch.Tensor, moved_z: torch.Tensor) -> torch.Tensor:
        """The map's losses from the walks alone (the recipe before the clearance; module docstring)."""
        motion, f = self.net.motion, self.mc.frames_per_chunk
        x, z = xz[:, 0, 0], xz[:, 0, 1]
        path = []
        for c in range(keys.shape[1] // f):
            sl = slice(c * f, (c + 1) * f)
            pos, _ = motion.walk(x, z, yaw[:, sl], keys[:, sl], hard=False)
            path.append(pos)
            end = xz[:, (c + 1) * f] if self.tc.reanchor else pos[:, -1]
            x, z = end[:, 0], end[:, 1]
        unrolled = torch.cat(path, dim=1)
        before, after = xz[:, :-1], xz[:, 1:]
        lx = motion.free_logit((before[..., 0] + dx.detach()).reshape(-1), before[..., 1].reshape(-1))
        lz = motion.free_logit(after[..., 0].reshape(-1), (before[..., 1] + dz.detach()).reshape(-1))
        tries_x = (dx.detach().abs() > 0.01).to(torch.float32).reshape(-1)  # a step along x worth a label
        tries_z = (dz.detach().abs() > 0.01).to(torch.float32).reshape(-1)
        bce = (F.binary_cross_entropy_with_logits(lx, moved_x.reshape(-1), reduction="none") * tries_x).sum()
        bce = (bce + (F.binary_cross_entropy_with_logits(lz, moved_z.reshape(-1), reduction="none") * tries_z).sum()
               ) / (tries_x.sum() + tries_z.sum()).clamp_min(1)
        stood = motion.free_logit(after[..., 0].reshape(-1), after[..., 1].reshape(-1))  # where it stood: free
        bce = bce + F.binary_cross_entropy_with_logits(stood, torch.ones_like(stood))
        return 100.0 * F.mse_loss(unrolled, after) + bce

    @torch.no_grad()
    def one_step_error(self, tolerance: float = 0.01) -> float:
        """The fraction of the walks' frames whose position after one hard step of the motion from
        the true pose is more than ``tolerance`` cells from the walk's."""
        xz = self.xz
        pos, _ = self.net.motion.walk(xz[:, :-1, 0].reshape(-1), xz[:, :-1, 1].reshape(-1),
                                      self.yaw.reshape(-1, 1), self.keys.reshape(-1, 1), hard=True)
        err = (pos[:, 0] - xz[:, 1:].reshape(-1, 2)).norm(dim=-1)
        return float((err > tolerance).to(torch.float32).mean())

    # -- loop --------------------------------------------------------------------------------------
    def total(self, stage: str) -> int:
        return int(getattr(self.tc, f"{stage}_steps"))

    def init_from(self, model_dir: Path, stage: int) -> None:
        """The view of a trained directory, then train from ``stage`` on (the motion from scratch
        when the motion stage is trained)."""
        state = {k: v.to(torch.float32) for k, v in
                 safetensors.torch.load_file(str(Path(model_dir) / WEIGHTS_FILE)).items()}
        if stage <= STAGES.index("motion"):  # the motion from scratch (its map may have another size)
            self.net.view.load_state_dict({k.removeprefix("view."): v for k, v in state.items()
                                           if k.startswith("view.")}, strict=True)
            torch.manual_seed(self.tc.seed)
            self.net.motion = Motion(self.mc)
        else:
            self.net.load_state_dict(state, strict=True)
        self.stage, self.step = stage, 0
        self.opt = self._optimizer()

    def save_checkpoint(self) -> None:
        torch.save({"net": self.net.state_dict(), "opt": self.opt.state_dict(), "stage": self.stage,
                    "step": self.step, "gen": self.gen.get_state(), "losses": self.losses,
                    "cpu_s": self.cpu_s, "wall_s": self.wall_s}, self.out / CHECKPOINT)

    def load_checkpoint(self) -> None:
        ck = torch.load(self.out / CHECKPOINT, weights_only=False)
        self.net.load_state_dict(ck["net"])
        self.stage, self.step, self.losses = ck["stage"], ck["step"], ck["losses"]
        self.opt = self._optimizer()
        self.opt.load_state_dict(ck["opt"])
        self.gen.set_state(ck["gen"])
        self.cpu_s, self.wall_s = ck["cpu_s"], ck["wall_s"]

    def run(self, resume: bool) -> dict[str, Any]:
        self.cpu_s = self.wall_s = 0.0
        if resume and (self.out / CHECKPOINT).is_file():
            self.load_checkpoint()
        loads = []
        while self.stage < len(STAGES):
            name = STAGES[self.stage]
            total = self.total(name)
            losses = getattr(self, f"{name}_loss")
            while self.step < total:
                c0, w0 = time.process_time(), time.perf_counter()
                for i, g in enumerate(self.opt.param_groups):
                    base = {"view": (self.tc.map_lr, self.tc.mlp_lr),
                            "motion": (self.tc.motion_lr, self.tc.step_lr)}[name][i]
                    g["lr"] = _cosine(base, self.step, total)
                loss = losses()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                self.losses[name].append(float(loss.detach()))
                self.step += 1
                self.cpu_s += time.process_time() - c0
                self.wall_s += time.perf_counter() - w0
                if self.step % 50 == 0:
                    loads.append(os.getloadavg()[0])
                    print(f"{name} {self.step}/{total} loss {np.mean(self.losses[name][-50:]):.4g} "
                          f"cpu {self.cpu_s:.0f}s wall {self.wall_s:.0f}s load {loads[-1]:.1f}", flush=True)
                if self.step % self.tc.checkpoint_every == 0:
                    self.save_checkpoint()
            self.stage, self.step = self.stage + 1, 0
            if self.stage < len(STAGES):
                self.opt = self._optimizer()
            self.save_checkpoint()
        return {"loads_every_50_steps": loads}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m execstate_bench.world_tools.maze_state_train",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init", type=Path, default=None, help="start from this trained directory's weights")
    ap.add_argument("--start-stage", choices=STAGES, default=STAGES[0], help="skip the stages before it")
    ap.add_argument("--maze-seed", type=int, default=StateModelConfig.maze_seed)
    for f in dataclasses.fields(TrainConfig):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    tc = TrainConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(TrainConfig)})
    start = pose.start_pose(layout.generate(a.maze_seed))
    mc = StateModelConfig(maze_seed=a.maze_seed, home_x=start.x, home_z=start.z, home_yaw=start.yaw)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.process_time()
    trainer = Trainer(tc, mc, a.out)
    if a.init is not None and not (a.resume and (a.out / CHECKPOINT).is_file()):
        trainer.init_from(a.init, STAGES.index(a.start_stage))
    data_cpu_s = time.process_time() - t0
    extra = trainer.run(a.resume)
    digest = save_weights(trainer.net, a.out)
    record = {"train": dataclasses.asdict(tc), "model": mc.to_dict(),
              "init": None if a.init is None else {"from": str(a.init), "start_stage": a.start_stage},
              "data_cpu_s": round(data_cpu_s, 1),
              "train_cpu_s": round(trainer.cpu_s, 1), "train_wall_s": round(trainer.wall_s, 1),
              "loss_first_last_50": {k: [round(float(np.mean(v[:50])), 5), round(float(np.mean(v[-50:])), 5)]
                                     for k, v in trainer.losses.items() if v},
              "motion_one_step_error": round(trainer.one_step_error(), 5),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
              "weights_sha256": digest, **extra}
    (a.out / "train.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record[k] for k in ("train_cpu_s", "train_wall_s", "loss_first_last_50")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
