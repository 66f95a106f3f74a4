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
of the loss and drowned the learnable part (the next frames given the previous ones). AdamW, linear warm-up, cosine
decay to ``lr * 0.1``, gradient clipping at 1.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from execstate.model.world.config import WorldModelConfig
from execstate.model.world.latent_codec import LatentCodec
from execstate.model.world.transformer import WorldTransformer
from execstate.model.world.weights import save_weights
from execstate_bench.world_tools import data, teacher


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
    # > 0 (needs conv_channels): a first stage of this many steps trains the convolutional path
    # alone (stem, head, carry gains; no attention): the world's local rules, at a tenth of a
    # full step's cost, before the transformer learns the rest on top of them
    local_steps: int = 0
    local_batch_size: int = 16
    # the second stage's learning rate of the conv path, relative to ``lr`` (0: frozen, so the
    # transformer learns only what the convolutions cannot: the prompt, the sink, the context)
    conv_lr_scale: float = 1.0


def _lr(cfg: TrainConfig, step: int, steps: int | None = None) -> float:
    steps = cfg.steps if steps is None else steps
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, steps - cfg.warmup)
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
    conv = {id(p) for p in _conv_params(model)}
    groups = [{"params": [p for p in model.parameters() if id(p) not in conv], "scale": 1.0}]
    if conv:
        groups.append({"params": [p for p in model.parameters() if id(p) in conv], "scale": cfg.conv_lr_scale})
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    sched = torch.tensor(model_cfg.schedule)
    lc = LatentCodec(model_cfg)
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    local_losses = _train_local(model, model_cfg, cfg, rng, gen, log, log_every) if cfg.local_steps else []
    losses = _LossLog(log_every, cfg.steps)
    for step in range(cfg.steps):
        batch = data.sample_batch(rng, model_cfg, cfg.batch_size, cfg.max_start, cfg.p_theme_change)
        b, n = batch.latents.shape[:2]
        t = _flow_times(cfg, sched, (b, n), gen)
        noise = torch.randn(batch.latents.shape, generator=gen)
        clean_noise = carry_noise = None
        if cfg.context_noise > 0:
            sigma = torch.rand((b, n, 1, 1), generator=gen) * cfg.context_noise
            clean_noise = sigma * torch.randn(batch.latents.shape, generator=gen)
            carry_noise = sigma[..., None] * torch.randn(batch.carry.shape, generator=gen)
            carry_noise[:, 0] = 0.0  # the sink's carry is "no frames": zeros, exactly
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step) * group["scale"]
        context = None
        if cfg.p_own_history > 0:
            own = torch.rand(b, generator=gen) < cfg.p_own_history
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                context, carry = teacher.own_history(model, batch, own)
            batch = dataclasses.replace(batch, carry=carry)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            pred = teacher.predict(model, batch, t, noise, clean_noise, carry_noise, context)
        loss = lc.loss(pred, batch.latents, _loss_weights(cfg, batch))
        if losses.add(step, _optimizer_step(opt, model.parameters(), loss)):
            if log:
                log(f"step {step + 1}/{cfg.steps} loss {losses.means[-1]:.5f} "
                    f"{time.perf_counter() - start_wall:.0f}s")
            if on_log:
                on_log(step + 1, model)
    model.eval()
    stats = {
        "losses": losses.means,
        "local_losses": local_losses,
        "log_every": log_every,
        "wall_s": round(time.perf_counter() - start_wall, 1),
        "cpu_s": round(time.process_time() - start_cpu, 1),
        "threads": cfg.threads,
        "torch": torch.__version__,
    }
    return model, stats


def _optimizer_step(opt: torch.optim.Optimizer, params: Iterable[torch.nn.Parameter], loss: torch.Tensor) -> float:
    """Backward, clip the gradients of ``params`` at norm 1, step; returns the loss value."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss.item()


class _LossLog:
    """Mean loss per ``every`` steps (and over the last, shorter stretch of ``total``)."""

    def __init__(self, every: int, total: int) -> None:
        self.every, self.total = every, total
        self.means: list[float] = []
        self._recent: list[float] = []

    def add(self, step: int, loss: float) -> bool:
        """Record step ``step``'s loss; True when it closed a stretch (a new entry in ``means``)."""
        self._recent.append(loss)
        if (step + 1) % self.every and step + 1 != self.total:
            return False
        self.means.append(float(np.mean(self._recent)))
        self._recent = []
        return True


def _flow_times(cfg: TrainConfig, sched: torch.Tensor, shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """One flow time per chunk: a schedule time with probability ``p_schedule``, else uniform in [0, 1)."""
    pick = torch.randint(len(sched), shape, generator=gen)
    uniform = torch.rand(shape, generator=gen)
    return torch.where(torch.rand(shape, generator=gen) < cfg.p_schedule, sched[pick], uniform)


def _loss_weights(cfg: TrainConfig, batch: data.Batch) -> torch.Tensor:
    w = 1.0 + cfg.motion_weight * batch.changed.to(torch.float32)
    w[:, 0] *= cfg.sink_loss_weight
    return w


def _conv_params(model: WorldTransformer) -> list[torch.nn.Parameter]:
    """The convolutional path: stem, head and the carry gains (empty without convolutions)."""
    if model.stem is None or model.head is None:
        return []
    return [*model.stem.parameters(), *model.head.parameters(),
            *(p for p in (model.copy_gain, model.shift_gain) if p is not None)]


def _train_local(model: WorldTransformer, model_cfg: WorldModelConfig, cfg: TrainConfig, rng: np.random.Generator,
                 gen: torch.Generator, log: Callable[[str], None] | None, log_every: int) -> list[float]:
    """The first stage: ``local_steps`` steps on the convolutional path alone (``local_only``:
    stem, head and carry gains; the transformer's output is zero-initialised, so the full model
    starts the second stage exactly where this one ends). Batches of ``local_batch_size``
    without theme changes (a prompt is not visible to the convolutions); its own AdamW, warm-up
    and cosine schedule. Returns the mean loss per ``log_every`` steps."""
    if not model_cfg.conv_channels or model.stem is None or model.head is None:
        raise ValueError("local_steps needs the convolutional path (conv_channels > 0)")
    params = _conv_params(model)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    sched = torch.tensor(model_cfg.schedule)
    lc = LatentCodec(model_cfg)
    start = time.perf_counter()
    losses = _LossLog(log_every, cfg.local_steps)
    for step in range(cfg.local_steps):
        batch = data.sample_batch(rng, model_cfg, cfg.local_batch_size, cfg.max_start, 0.0)
        t = _flow_times(cfg, sched, (batch.latents.shape[0], batch.latents.shape[1]), gen)
        noise = torch.randn(batch.latents.shape, generator=gen)
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step, cfg.local_steps)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            pred = teacher.predict(model, batch, t, noise, local_only=True)
        loss = lc.loss(pred, batch.latents, _loss_weights(cfg, batch))
        if losses.add(step, _optimizer_step(opt, params, loss)) and log:
            log(
                f"local step {step + 1}/{cfg.local_steps} loss {losses.means[-1]:.5f} "
                f"{time.perf_counter() - start:.0f}s"
            )
    return losses.means


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
