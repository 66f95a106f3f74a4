"""``execstate world train``: train the world model on the renderer, deterministically from a seed.

Every random draw comes from generators seeded by ``TrainConfig.seed`` (numpy for the data,
torch for the initial weights, the flow times and the noise), the number of steps is fixed (no
wall-clock budget, which would make the result depend on the machine's load), and the torch
thread count is pinned, so the same command gives the same weights (``weights_sha256``) on this
machine. Matmuls run under bf16 autocast by default (``bf16``): about 1.7x faster on these
CPUs (AVX512-BF16); the master weights, optimizer and loss stay fp32.

Each step: a batch of chunk sequences from :mod:`data`, one flow time per chunk (from the
sampler's schedule with probability ``p_schedule``, else uniform in [0, 1)), teacher forcing
(:mod:`teacher`) and the codec's loss (:mod:`latent_codec`: MSE on predicted patches, or
cross-entropy on predicted palette cells), weighted ``1 + motion_weight`` on
latent units (pixels or cells) that differ from the previous frame (the agent and movers: most of a frame is static
floor and walls), and by ``sink_loss_weight`` on the sink chunk: generated from nothing (no
carry, no context), its loss is mostly the unpredictable random maze, which at weight 1 was most
of the loss and drowned the learnable part (the next frames given the previous ones). AdamW, linear warm-up, cosine decay to ``lr * 0.1``, gradient clipping at 1.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from execstate.model.world import data, teacher
from execstate.model.world.config import WorldModelConfig
from execstate.model.world.latent_codec import LatentCodec
from execstate.model.world.transformer import WorldTransformer
from execstate.model.world.weights import save_weights


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 2000
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    max_start: int = 24
    p_theme_change: float = 0.3
    p_schedule: float = 0.75
    motion_weight: float = 4.0
    context_noise: float = 0.0  # std of the noise added to context chunks and carries (uniform in [0, this])
    p_own_history: float = 0.0  # share of samples whose context/carries are the model's own predictions
    sink_loss_weight: float = 0.05  # loss weight of the sink chunk (generated from nothing: mostly unpredictable)
    bf16: bool = True
    threads: int = 1


def _lr(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(model_cfg: WorldModelConfig, cfg: TrainConfig, log: Callable[[str], None] | None = None,
          log_every: int = 50, on_log: Callable[[int, WorldTransformer], None] | None = None,
          ) -> tuple[WorldTransformer, dict[str, Any]]:
    """Train from scratch; returns the model (eval mode) and stats (losses, times). ``log`` gets a
    line and ``on_log`` the step count and the model every ``log_every`` steps (e.g. to save
    intermediate weights); neither changes the result."""
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train(model_cfg, cfg, log, log_every, on_log)
    finally:
        torch.set_num_threads(threads_before)


def _train(model_cfg: WorldModelConfig, cfg: TrainConfig, log: Callable[[str], None] | None,
           log_every: int, on_log: Callable[[int, WorldTransformer], None] | None,
           ) -> tuple[WorldTransformer, dict[str, Any]]:
    torch.manual_seed(cfg.seed)
    model = WorldTransformer(model_cfg)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    sched = torch.tensor(model_cfg.schedule)
    lc = LatentCodec(model_cfg)
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    losses: list[float] = []
    recent: list[float] = []
    for step in range(cfg.steps):
        batch = data.sample_batch(rng, model_cfg, cfg.batch_size, cfg.max_start, cfg.p_theme_change)
        b, n = batch.latents.shape[:2]
        pick = torch.randint(len(sched), (b, n), generator=gen)
        uniform = torch.rand((b, n), generator=gen)
        t = torch.where(torch.rand((b, n), generator=gen) < cfg.p_schedule, sched[pick], uniform)
        noise = torch.randn(batch.latents.shape, generator=gen)
        clean_noise = carry_noise = None
        if cfg.context_noise > 0:
            sigma = torch.rand((b, n, 1, 1), generator=gen) * cfg.context_noise
            clean_noise = sigma * torch.randn(batch.latents.shape, generator=gen)
            carry_noise = sigma[..., None] * torch.randn(batch.carry.shape, generator=gen)
            carry_noise[:, 0] = 0.0  # the sink's carry is "no frames": zeros, exactly
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step)
        context = None
        if cfg.p_own_history > 0:
            own = torch.rand(b, generator=gen) < cfg.p_own_history
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                context, carry = teacher.own_history(model, batch, own)
            batch = dataclasses.replace(batch, carry=carry)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            pred = teacher.predict(model, batch, t, noise, clean_noise, carry_noise, context)
        w = 1.0 + cfg.motion_weight * batch.changed.to(torch.float32)
        w[:, 0] *= cfg.sink_loss_weight
        loss = lc.loss(pred, batch.latents, w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == cfg.steps:
            losses.append(float(np.mean(recent)))
            recent = []
            if log:
                log(f"step {step + 1}/{cfg.steps} loss {losses[-1]:.5f} "
                    f"{time.perf_counter() - start_wall:.0f}s")
            if on_log:
                on_log(step + 1, model)
    model.eval()
    stats = {"losses": losses, "log_every": log_every, "wall_s": round(time.perf_counter() - start_wall, 1),
             "cpu_s": round(time.process_time() - start_cpu, 1), "threads": cfg.threads,
             "torch": torch.__version__}
    return model, stats


def train_to_dir(out_dir: Path, model_cfg: WorldModelConfig, cfg: TrainConfig,
                 log: Callable[[str], None] | None = None, extra: dict[str, Any] | None = None,
                 on_saving: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train and write ``model.safetensors``, ``config.json`` and ``train.json`` (the train config,
    stats, the weights' sha256 and ``extra``) into ``out_dir``; returns the train.json content."""
    model, stats = train(model_cfg, cfg, log, log_every=max(1, min(100, cfg.steps // 4)))
    if on_saving:
        on_saving()
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = save_weights(model, out_dir)
    record = {"train_config": dataclasses.asdict(cfg), "stats": stats, "weights_sha256": digest, **(extra or {})}
    (out_dir / "train.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
