"""The tensors of a Hugging Face checkpoint directory, read as they are (no model is built).

``load_hf_state_dict(path)`` reads ``model.safetensors``, or every shard listed in
``model.safetensors.index.json`` (``ValueError`` naming the tensors an index lists but no shard
holds, or when the directory has neither file). It imports nothing of the model, so the embedded
model recipes (``gguf_quantize.py``) can read a checkpoint without the model classes
(``loader.py`` builds a model from the same tensors).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def report(kind: str, names: list[str]) -> str:
    """``kind: a, b, ...`` with at most 20 names shown."""
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    return f"{kind}: {shown}"


def load_hf_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards in ``model.safetensors.index.json``, on CPU."""
    path = Path(path)
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if index.is_file():
        with index.open() as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(load_file(path / shard))
        absent = sorted(set(weight_map) - set(state))
        if absent:
            raise ValueError(report(f"tensors listed in {index.name} but absent from the shards", absent))
        return state
    if single.is_file():
        return load_file(single)
    raise ValueError(f"no model.safetensors or model.safetensors.index.json in {path}")
