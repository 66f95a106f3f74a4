"""The recipe of the embedded world model ``world`` (``execstate models prepare world``).

The registry (``model/registry.py``) calls :func:`build` with :data:`PARAMS`; the params are part
of the build's fingerprint, so changing the model or training config (or :data:`RECIPE_VERSION`)
rebuilds it. The build trains from scratch on the renderer (deterministic from the seed, see the
world tools' ``train``, ``benchmarks/execstate_bench/world_tools/train.py``, reached through
``model/world/tools_import.py``) and writes ``model.safetensors``, ``config.json`` and
``train.json`` (train config, losses, wall/CPU time, the weights' sha256).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RECIPE_VERSION = 3
BUILD_STEPS = ("training on the procedural world", "writing weights")
ESTIMATE = "about 15 min on an idle CPU core, 20-25 min on a loaded 2-core machine"
PARAMS: dict[str, Any] = {
    # palette cells with the convolutional path (docs/world-model.md 2 and 6): the keys and the
    # previous frame of the chunk reach the convolutions; the second sampler iteration at t = 0.75
    # sees the first one's snapped frames clearly
    "model": {"d_model": 128, "n_layers": 4, "n_heads": 4, "action_shift_px": 1, "codec": "palette",
              "conv_channels": 64, "conv_layers": 4, "conv_keys": True, "conv_prev_frame": True,
              "schedule": (0.0, 0.75)},
    # one torch thread: on a shared 2-core machine a 2-thread step spends most of its CPU time
    # waiting at OpenMP barriers (measured ~2 CPU-s per step under load vs 0.33 with one thread).
    # 6,000 steps of the conv path alone (the local rules, batch 16), then 1,000 of the whole model
    "train": {"seed": 0, "steps": 1000, "batch_size": 8, "threads": 1, "context_noise": 0.0,
              "local_steps": 6000, "local_batch_size": 16},
}


def build(out_dir: Path, deps: list[Path], on_step: Callable[[str], None] | None = None, **params: Any) -> None:
    from execstate.model.world.config import WorldModelConfig
    from execstate.model.world.tools_import import world_tool

    train = world_tool("train")
    TrainConfig, train_to_dir = train.TrainConfig, train.train_to_dir  # noqa: N806

    step = on_step or (lambda _: None)
    step(BUILD_STEPS[0])
    train_to_dir(out_dir, WorldModelConfig.from_dict(params["model"]), TrainConfig(**params["train"]),
                 log=lambda line: print(f"  world: {line}", file=sys.stderr, flush=True),
                 extra={"command": "execstate models prepare world"}, on_saving=lambda: step(BUILD_STEPS[1]))
