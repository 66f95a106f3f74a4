"""Saving and loading the world model's weights (safetensors + config.json).

``weights_sha256`` is the sha256 of the safetensors file's bytes: safetensors writes tensors in
sorted name order with a deterministic header, so equal weights give equal files and digests.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from execstate.model.world.config import WorldModelConfig
from execstate.model.world.transformer import WorldTransformer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def save_weights(model: nn.Module, out_dir: Path, dtype: torch.dtype | None = None) -> str:
    """Write the weights (in ``dtype`` if given, e.g. fp16 for the shipped copy; loading always
    gives fp32) and config; returns the weights file's sha256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype or v.dtype).contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(tensors, str(out_dir / WEIGHTS_FILE))
    cfg: Any = model.cfg
    (out_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")
    return file_sha256(out_dir / WEIGHTS_FILE)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_module(model_dir: Path, config_cls: Any, module_cls: Any) -> Any:
    """``module_cls(config_cls.from_dict(config.json))`` with the weights of ``model_dir`` in fp32,
    in eval mode, without gradients (the world models' common loader)."""
    cfg = config_cls.from_dict(json.loads((Path(model_dir) / CONFIG_FILE).read_text()))
    model = module_cls(cfg)
    state = safetensors.torch.load_file(str(Path(model_dir) / WEIGHTS_FILE))
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_transformer(model_dir: Path) -> WorldTransformer:
    return load_module(model_dir, WorldModelConfig, WorldTransformer)


def export_weights(model_dir: Path, out_dir: Path, dtype: torch.dtype = torch.float16,
                   load: Callable[[Path], nn.Module] = load_transformer) -> str:
    """Copy a trained model directory to ``out_dir`` with the weights stored in ``dtype`` (how the
    shipped default model is made from a prepared one); ``train.json`` gets ``shipped_weights_sha256``
    and ``shipped_dtype``. Returns the new weights file's sha256."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    digest = save_weights(load(model_dir), out_dir, dtype)
    record = json.loads((model_dir / "train.json").read_text()) if (model_dir / "train.json").is_file() else {}
    record |= {"shipped_weights_sha256": digest, "shipped_dtype": str(dtype).removeprefix("torch.")}
    (out_dir / "train.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return digest
