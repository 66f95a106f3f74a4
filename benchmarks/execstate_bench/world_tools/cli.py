"""``execstate world train|eval|speed|export``: the grid world model's tools (argparse only at import;
torch is imported per command). The runtime's CLI adds this parser through the entry point
``world`` of the group ``execstate.commands`` (``benchmarks/pyproject.toml``, ``execstate/commands.py``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_world_parser(sub: argparse._SubParsersAction) -> None:
    from execstate.model.world.recipe import PARAMS

    w = sub.add_parser("world", help="the realtime world model: train, evaluate against the renderer, measure speed")
    wsub = w.add_subparsers(dest="world_cmd", required=True)
    m, t = PARAMS["model"], PARAMS["train"]
    tr = wsub.add_parser("train", help="train on the procedural world (deterministic from --seed); "
                                       "`execstate models prepare world` runs the default recipe")
    tr.add_argument("--out", required=True, type=Path, help="directory for model.safetensors, config.json, train.json")
    tr.add_argument("--seed", type=int, default=t["seed"])
    tr.add_argument("--steps", type=int, default=t["steps"])
    tr.add_argument("--batch-size", type=int, default=t["batch_size"])
    tr.add_argument("--threads", type=int, default=t["threads"], help="torch threads (default: %(default)s)")
    tr.add_argument("--d-model", type=int, default=m["d_model"])
    tr.add_argument("--layers", type=int, default=m["n_layers"])
    tr.add_argument("--heads", type=int, default=m["n_heads"])
    tr.add_argument("--codec", choices=("patch", "palette"), default=m.get("codec", "patch"),
                    help="latents: pixel patches (MSE) or one-hot palette cells (cross-entropy)")
    tr.add_argument("--conv-channels", type=int, default=m.get("conv_channels", 0),
                    help="palette codec: 3x3 convolutions over the cell grid around the transformer (0: off)")
    tr.add_argument("--conv-layers", type=int, default=m.get("conv_layers", 2), help="convolutions in the stem")
    tr.add_argument("--conv-keys", action=argparse.BooleanOptionalAction, default=m.get("conv_keys", False),
                    help="the stem gets the frame's keys as input channels")
    tr.add_argument("--conv-prev-frame", action=argparse.BooleanOptionalAction,
                    default=m.get("conv_prev_frame", False), help="frame f's stem also sees frame f-1's noisy input")
    tr.add_argument("--schedule", type=lambda v: tuple(float(x) for x in v.split(",")),
                    default=tuple(m.get("schedule", (0.0, 0.5))),
                    help="flow times the sampler visits, comma-separated (default: %(default)s)")
    tr.add_argument("--local-steps", type=int, default=t.get("local_steps", 0),
                    help="a first stage of this many steps training the conv path alone (0: none)")
    tr.add_argument("--local-batch-size", type=int, default=t.get("local_batch_size", 16))
    tr.add_argument("--action-shift-px", type=int, default=m["action_shift_px"],
                    help="input the carry shifted by the keys' moves, this many latent units (px, or cells) "
                         "per cell (0: off)")
    tr.add_argument("--context-noise", type=float, default=t["context_noise"],
                    help="max std of the noise added to context chunks and carries in training")
    ev = wsub.add_parser("eval", help="action following, PSNR and drift against the renderer; a comparison PNG")
    ev.add_argument(
        "model",
        nargs="?",
        default="world",
        help="a trained model directory, or 'world' (the prepared model, else the shipped weights)",
    )
    ev.add_argument("--episodes", type=int, default=8)
    ev.add_argument("--steps", type=int, default=64, help="steps (chunks) per episode")
    ev.add_argument("--drift-steps", type=int, default=500, help="steps of the rolling-window rollout (0: skip)")
    ev.add_argument("--png", type=Path, default=None, help="write generated-above-renderer frames here")
    ev.add_argument("--threads", type=int, default=2)
    sp = wsub.add_parser("speed", help="step latency eager and compiled, compiled vs eager K/V difference")
    sp.add_argument("model", nargs="?", default="world")
    sp.add_argument("--steps", type=int, default=64)
    sp.add_argument("--threads", type=int, default=2)
    sp.add_argument("--compiled", action="store_true", help="also torch.compile (minutes of warm-up on 2 cores)")
    ex = wsub.add_parser("export", help="copy a trained model with its weights in fp16/bf16 (how the shipped "
                                        "default weights are made from `execstate models prepare world`)")
    ex.add_argument("model", type=Path, help="a trained model directory")
    ex.add_argument("--out", required=True, type=Path)
    ex.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    w.set_defaults(func=run_world)


def train_configs(args: argparse.Namespace):  # noqa: ANN201 - (WorldModelConfig, TrainConfig, command line)
    """``world train``'s arguments -> the model and train configs and the equivalent command line
    (recorded in train.json). Without flags these are the default recipe's (``recipe.PARAMS``)."""
    from execstate.model.world.config import WorldModelConfig
    from execstate_bench.world_tools.train import TrainConfig

    model_args = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads,
                  "action_shift_px": args.action_shift_px, "codec": args.codec,
                  "conv_channels": args.conv_channels, "conv_layers": args.conv_layers,
                  "conv_keys": args.conv_keys, "conv_prev_frame": args.conv_prev_frame, "schedule": args.schedule}
    train_args = {"seed": args.seed, "steps": args.steps, "batch_size": args.batch_size, "threads": args.threads,
                  "context_noise": args.context_noise, "local_steps": args.local_steps,
                  "local_batch_size": args.local_batch_size}
    flags = {"n_layers": "layers", "n_heads": "heads"}  # config field -> flag, where they differ
    words = [f"execstate world train --out {args.out}"]
    for key, value in {**train_args, **model_args}.items():
        flag = flags.get(key, key).replace("_", "-")
        if isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        words.append(f"--{flag} {value}" if not isinstance(value, bool) else f"--{'' if value else 'no-'}{flag}")
    return WorldModelConfig(**model_args), TrainConfig(**train_args), " ".join(words)


def _load(name: str, numerics: str = "eager"):  # noqa: ANN202 - lazy import of the model type
    from execstate.model.world.model import ChunkedWorldModel
    from execstate.model.world_default import load_default_world_model

    if name == "world":  # the prepared model if there is one, else the shipped weights
        return load_default_world_model(numerics)
    path = Path(name)
    if not path.is_dir():
        raise ValueError(f"{name!r} is not a model directory or 'world'")
    return ChunkedWorldModel.load(path, numerics=numerics, model_id=name)


def run_world(args: argparse.Namespace) -> int:
    import torch

    if args.world_cmd == "train":
        from execstate_bench.world_tools.train import train_to_dir

        model_cfg, cfg, command = train_configs(args)
        record = train_to_dir(args.out, model_cfg, cfg, log=print, extra={"command": command})
        print(json.dumps({k: record[k] for k in ("weights_sha256", "command")} | {
            "wall_s": record["stats"]["wall_s"], "cpu_s": record["stats"]["cpu_s"]}, indent=2))
        return 0
    if args.world_cmd == "export":
        from execstate.model.world.weights import export_weights

        print(json.dumps({"out": str(args.out), "weights_sha256": export_weights(
            args.model, args.out, getattr(torch, args.dtype))}, indent=2))
        return 0
    torch.set_num_threads(args.threads)
    if args.world_cmd == "eval":
        from execstate_bench.world_tools import eval as world_eval

        model = _load(args.model)
        report: dict[str, Any] = {"quality": world_eval.evaluate(model, seeds=range(args.episodes), steps=args.steps)}
        if args.drift_steps:
            report["drift"] = world_eval.drift(model, steps=args.drift_steps)
        if args.png:
            report["png"] = str(world_eval.comparison_png(model, args.png))
        print(json.dumps(report, indent=2))
        return 0
    if args.world_cmd == "speed":
        from execstate_bench.world_tools import speed

        report = {"eager": speed.step_times(_load(args.model), steps=args.steps)}
        if args.compiled:
            compiled = _load(args.model, "compiled")
            report["compiled"] = speed.step_times(compiled, steps=args.steps, warmup=1)
            diffs = speed.kv_parity(_load(args.model), compiled, steps=16)
            report["kv_max_abs_diff"] = max(diffs)
            report["kv_max_abs_diff_per_step"] = diffs
        print(json.dumps(report, indent=2))
        return 0
    raise AssertionError(args.world_cmd)
