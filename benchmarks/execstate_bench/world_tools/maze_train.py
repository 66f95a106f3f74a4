"""Train the maze world model on the raycaster, deterministically from a seed, with checkpoints.

``python -m execstate_bench.world_tools.maze_train --out runs/maze`` (flags: ``--help``); the recipe's defaults are
:class:`TrainConfig`'s and :class:`MazeModelConfig`'s. Three stages, one AdamW optimizer, a warm-up
then cosine decay over the stages' total, bf16 autocast (master weights and loss in fp32):

1. ``local_steps``: the local path alone (the U-Net; ``network.py``): a chunk from the frame before
   it, the keys and the camera (``maze_teacher.predict(local_only=True)``). The transformer's output
   layer is zero, so stage 2 starts from exactly what this stage learnt.
2. ``teacher_steps``: teacher forcing (``maze_teacher``): the sink and ``1 .. max_window`` chunks of
   a trajectory (short windows more often), every chunk after the sink a target. Gradients reach the
   context's K/V, so the model learns to write a memory it can read back (the same place seen at the
   same world angle).
3. ``rolling_steps``: rolling self-forcing (``maze_rolling``): ``envs`` rollouts of the model itself,
   ``rollout_chunks`` chunks long, each step's chunk predicted from the model's own context and
   compared with the renderer's; a chunk is committed from the renderer instead with probability
   ``p_truth_start`` falling to ``p_truth_end`` (re-anchoring, ``maze_rolling``'s docstring), and
   every ``teacher_every``-th step is a teacher-forcing step.

Each stage's weights are also kept (``out/after-local``, ``out/after-teacher``).

Loss: mean squared error of the frames in ``[-1, 1]`` (PSNR is what the model is measured by).
With ``degrade``, stages 1 and 2 attend to and carry degraded frames (``maze_augment``: blur,
colour and brightness, noise; never the sink) while the targets stay the renderer's.

Every ``checkpoint_every`` steps the state (weights, optimizer, data generator, stage and step) goes
to ``out/checkpoint.pt``; ``--resume`` continues from it, so a run can be stopped and picked up
(the machine is shared). The result: ``model.safetensors``, ``config.json`` and ``train.json``
(configs, losses per stage, wall and CPU time, machine load, the weights' sha256).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from execstate.model.world.maze.config import MazeModelConfig
from execstate.model.world.maze.network import MazeNet
from execstate.model.world.weights import save_weights
from execstate_bench.world_tools import maze_teacher
from execstate_bench.world_tools.maze_augment import degrade
from execstate_bench.world_tools.maze_data import random_trajectory
from execstate_bench.world_tools.maze_rolling import RollingEnvs

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    local_steps: int = 500
    local_batch: int = 12
    teacher_steps: int = 700
    teacher_batch: int = 4
    max_window: int = 16
    rolling_steps: int = 1200
    envs: int = 4
    rollout_chunks: int = 60
    p_truth_start: float = 0.7  # rolling: the share of chunks committed from the renderer, at the start
    p_truth_end: float = 0.2  # ... and at the end (linear in between)
    teacher_every: int = 4  # rolling: every this many steps, a teacher-forcing step instead (0: never)
    degrade: bool = True  # teacher forcing on degraded context and carries (maze_augment)
    lr: float = 1.5e-3
    warmup: int = 100
    weight_decay: float = 0.01
    threads: int = 1
    bf16: bool = True
    checkpoint_every: int = 100

    @property
    def total_steps(self) -> int:
        return self.local_steps + self.teacher_steps + self.rolling_steps


def _lr(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.total_steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def _window_len(rng: np.random.Generator, max_window: int) -> int:
    """Short windows more often (cheap, and most of what there is to learn is local)."""
    return int(min(max_window, 1 + rng.geometric(0.25)))


class Trainer:
    def __init__(self, model_cfg: MazeModelConfig, cfg: TrainConfig, out: Path,
                 log: Callable[[str], None]) -> None:
        self.model_cfg, self.cfg, self.out, self.log = model_cfg, cfg, out, log
        torch.manual_seed(cfg.seed)
        self.net = MazeNet(model_cfg)
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=cfg.lr, betas=(0.9, 0.99),
                                     weight_decay=cfg.weight_decay)
        self.rng = np.random.default_rng(cfg.seed)
        self.step = 0
        self.losses: dict[str, list[float]] = {"local": [], "teacher": [], "rolling": []}
        self.wall = self.cpu = 0.0
        self.rolling: RollingEnvs | None = None

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        tmp = self.out / (CHECKPOINT + ".tmp")
        torch.save({"net": self.net.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "losses": self.losses,
                    "wall": self.wall, "cpu": self.cpu, "config": dataclasses.asdict(self.cfg),
                    "model": self.model_cfg.to_dict()}, tmp)
        os.replace(tmp, self.out / CHECKPOINT)

    def load_checkpoint(self) -> None:
        ck = torch.load(self.out / CHECKPOINT, weights_only=False)
        if ck["config"] != dataclasses.asdict(self.cfg) or ck["model"] != self.model_cfg.to_dict():
            raise ValueError("the checkpoint was written by another configuration")
        self.net.load_state_dict(ck["net"])
        self.opt.load_state_dict(ck["opt"])
        self.step, self.losses, self.wall, self.cpu = ck["step"], ck["losses"], ck["wall"], ck["cpu"]
        self.rng.bit_generator.state = ck["rng"]
        torch.set_rng_state(ck["torch_rng"])

    # -- one step of each stage -------------------------------------------------------------------
    def _teacher_loss(self, local: bool) -> torch.Tensor:
        cfg, mcfg = self.cfg, self.model_cfg
        f = mcfg.frames_per_chunk
        k = int(self.rng.integers(1, 4)) if local else _window_len(self.rng, cfg.max_window)
        n = cfg.local_batch if local else cfg.teacher_batch
        length = k + 1 + int(self.rng.integers(0, 12))  # chunks after the sink, a gap before the window
        trajs = [random_trajectory(self.rng, (length + 1) * f, f) for _ in range(n)]
        starts = [length + 1 - k] * n
        batch = maze_teacher.window_batch(trajs, starts, k, mcfg)
        context = carry = None
        if cfg.degrade:  # the context and carries as a free-running model would feed them (maze_augment)
            context = batch.frames.clone()
            context[:, 1:] = degrade(batch.frames[:, 1:], self.rng)  # never the sink
            carry = batch.carry.clone()
            carry[:, 1:] = degrade(batch.carry[:, 1:], self.rng)
        pred = maze_teacher.predict(self.net, batch, context=context, local_only=local, carry=carry)
        return ((pred.float() - batch.frames[:, 1:]) ** 2).mean()

    def _rolling_loss(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rolling is None:
            self.rolling = RollingEnvs(self.net, self.cfg.envs, self.cfg.rollout_chunks, self.rng)
        pred, truth = self.rolling.predict()
        return ((pred.float() - truth) ** 2).mean(), pred

    def run(self) -> None:
        cfg = self.cfg
        self.net.train()
        t_wall, t_cpu = time.perf_counter(), time.process_time()
        while self.step < cfg.total_steps:
            for group in self.opt.param_groups:
                group["lr"] = _lr(cfg, self.step)
            stage = ("local" if self.step < cfg.local_steps else
                     "teacher" if self.step < cfg.local_steps + cfg.teacher_steps else "rolling")
            rolled = self.step - cfg.local_steps - cfg.teacher_steps
            if stage == "rolling" and cfg.teacher_every and rolled % cfg.teacher_every == cfg.teacher_every - 1:
                stage = "teacher"  # keeps what teacher forcing taught while the model trains on its rollouts
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                if stage == "rolling":
                    loss, pred = self._rolling_loss()
                else:
                    loss = self._teacher_loss(stage == "local")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
            self.opt.step()
            if stage == "rolling":
                assert self.rolling is not None
                frac = rolled / max(1, cfg.rolling_steps - 1)
                self.rolling.advance(pred, cfg.p_truth_start + (cfg.p_truth_end - cfg.p_truth_start) * frac)
            self.losses[stage].append(float(loss.detach()))
            self.step += 1
            if self.step % 25 == 0:
                recent = self.losses[stage][-25:]
                self.log(f"step {self.step}/{cfg.total_steps} {stage} loss {np.mean(recent):.5f} "
                         f"psnr~{10 * np.log10(4 / max(float(np.mean(recent)), 1e-10)):.2f} dB "
                         f"{time.perf_counter() - t_wall + self.wall:.0f} s")
            if self.step in (cfg.local_steps, cfg.local_steps + cfg.teacher_steps):  # each stage's result, kept
                save_weights(self.net, self.out / f"after-{stage}")
            if self.step % cfg.checkpoint_every == 0 or self.step == cfg.total_steps:
                self.wall += time.perf_counter() - t_wall
                self.cpu += time.process_time() - t_cpu
                t_wall, t_cpu = time.perf_counter(), time.process_time()
                self.save_checkpoint()
        self.net.eval()

    def finish(self, extra: dict[str, Any] | None = None) -> str:
        digest = save_weights(self.net, self.out)
        record = {"model": self.model_cfg.to_dict(), "train": dataclasses.asdict(self.cfg),
                  "weights_sha256": digest, "wall_s": round(self.wall, 1), "cpu_s": round(self.cpu, 1),
                  "machine": f"{platform.machine()} {os.cpu_count()} cpus", "load_at_end": os.getloadavg(),
                  "losses": {k: [round(float(np.mean(v[i : i + 25])), 6) for i in range(0, len(v), 25)]
                             for k, v in self.losses.items()}, **(extra or {})}
        (self.out / "train.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return digest


def train_to_dir(out: Path, model_cfg: MazeModelConfig, cfg: TrainConfig, resume: bool = False,
                 log: Callable[[str], None] = print, extra: dict[str, Any] | None = None) -> str:
    """Train (or continue a checkpointed run) into ``out``; returns the weights' sha256."""
    out.mkdir(parents=True, exist_ok=True)
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        tr = Trainer(model_cfg, cfg, out, log)
        if resume and (out / CHECKPOINT).is_file():
            tr.load_checkpoint()
            log(f"resumed at step {tr.step}")
        tr.run()
        return tr.finish(extra)
    finally:
        torch.set_num_threads(before)


def export_checkpoint(run: Path, out: Path) -> str:
    """The weights of ``run``'s checkpoint as a model directory (to measure a run while it trains)."""
    ck = torch.load(run / CHECKPOINT, weights_only=False)
    net = MazeNet(MazeModelConfig.from_dict(ck["model"]))
    net.load_state_dict(ck["net"])
    return save_weights(net, out)


def main(argv: list[str] | None = None) -> int:
    d, m = TrainConfig(), MazeModelConfig()
    ap = argparse.ArgumentParser(prog="python -m execstate_bench.world_tools.maze_train",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true", help="continue from out/checkpoint.pt if it is there")
    for f in dataclasses.fields(TrainConfig):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(d, f.name)), default=getattr(d, f.name))
    for name in ("d_model", "n_layers", "window_chunks"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(m, name))
    a = ap.parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(TrainConfig)})
    model_cfg = dataclasses.replace(m, d_model=a.d_model, n_layers=a.n_layers, window_chunks=a.window_chunks)
    print(train_to_dir(a.out, model_cfg, cfg, a.resume,
                       extra={"command": "python -m execstate_bench.world_tools.maze_train"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
