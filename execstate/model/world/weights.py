"""Saving and loading the world model's weights (safetensors + config.json).

``weights_sha256`` is the sha256 of the safetensors file's bytes: safetensors writes tensors in
sorted name order with a deterministic header, so equal weights give equal files and digests.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import safetensors.torch

from execstate.model.world.config import WorldModelConfig
from execstate.model.world.transformer import WorldTransformer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def save_weights(model: WorldTransformer, out_dir: Path) -> str:
    """Write the weights and config; returns the weights file's sha256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(tensors, str(out_dir / WEIGHTS_FILE))
    (out_dir / CONFIG_FILE).write_text(json.dumps(model.cfg.to_dict(), indent=2, sort_keys=True) + "\n")
    return file_sha256(out_dir / WEIGHTS_FILE)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_transformer(model_dir: Path) -> WorldTransformer:
    cfg = WorldModelConfig.from_dict(json.loads((Path(model_dir) / CONFIG_FILE).read_text()))
    model = WorldTransformer(cfg)
    state = safetensors.torch.load_file(str(Path(model_dir) / WEIGHTS_FILE))
    model.load_state_dict(state, strict=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
