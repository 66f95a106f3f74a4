"""A model served from a GGUF file as it is: Q8_0 / Q4_0 / Q4_1 blocks multiplied in place.

``load_gguf_model(model_dir, gguf_path)`` builds a ``CausalLM`` (config from ``model_dir``'s
config.json) whose matrices are the file's quantised blocks, byte for byte (uint8 parameters
``[rows, K / 32 * block bytes]``, ``kernels/weight_format.py``), each module told its format
(``weight_format`` / ``head_format``), so every matmul runs the GGUF kernels
(``kernels/gguf_blocks.py``: dequantised in registers, fp32 activations). F32 / F16 / BF16
tensors (norms, a router) become fp32 parameters; other GGUF types are refused.

Tensor names: a ``llama`` GGUF uses llama.cpp's names (``blk.N.attn_q.weight``...), mapped to
HF names as ``gguf_import`` does, with llama.cpp's q/k row permutation undone by reordering whole
rows of blocks (no value changes); any other file carries HF names (``gguf_quantize.py``). The
loader then fuses rows as for safetensors (q|k|v, gate|up, experts stacked): copies of the
blocks' bytes, never a dequantised copy. The token embedding of a GGUF model is looked up by
dequantising its rows (``GGUFEmbedding``); a tied LM head multiplies the same blocks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from execstate.kernels.gguf_blocks import dequantize_rows
from execstate.kernels.weight_format import WeightFormat
from execstate.model import gguf_import
from execstate.model.config import ModelConfig
from execstate.model.gguf_file import read_tensors
from execstate.model.layers import Linear
from execstate.model.loader import load_hf_weights, match_checkpoint
from execstate.model.moe import SparseMoE
from execstate.model.transformer import CausalLM

_BLOCK_TYPES = {"Q8_0": WeightFormat.Q8_0, "Q4_0": WeightFormat.Q4_0, "Q4_1": WeightFormat.Q4_1}
_FLOAT_TYPES = ("F32", "F16", "BF16")


class GGUFEmbedding(nn.Module):
    """Token embedding on GGUF blocks: ``forward(ids [T]) -> fp32 [T, dim]``, each row dequantised
    (``gguf_blocks.dequantize_rows``: the kernels' values). ``weight``: uint8 ``[num, dim / 32 * bytes]``."""

    def __init__(self, num: int, dim: int, fmt: WeightFormat) -> None:
        super().__init__()
        shape, dtype = fmt.storage(num, dim)
        self.weight = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
        self.weight_format = fmt

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.weight, ids, self.weight_format)


def read_gguf(path: Path, config: ModelConfig) -> tuple[dict[str, torch.Tensor], dict[str, WeightFormat]]:
    """(HF name -> tensor, HF name -> block format) of every tensor in the GGUF file ``path``:
    block tensors as uint8 rows, float ones as fp32 (``gguf_file.read_tensors``: the metadata
    values are skipped, not parsed)."""
    meta, file_tensors = read_tensors(Path(path))
    llama = meta.get("general.architecture") == "llama"
    tensors: dict[str, torch.Tensor] = {}
    formats: dict[str, WeightFormat] = {}
    for t in file_tensors:
        kind = t.kind
        if kind not in _BLOCK_TYPES and kind not in _FLOAT_TYPES:
            raise ValueError(f"{Path(path).name}: tensor {t.name} is {kind}; served as is: {sorted(_BLOCK_TYPES)} "
                             f"(and {', '.join(_FLOAT_TYPES)})")
        data = t.data
        if kind == "F16":
            data = data.astype(np.float32)
        elif kind == "BF16":
            data = (data.astype(np.uint32) << 16).view(np.float32)
        name = t.name
        if llama:
            if ".attn_q." in name:
                data = gguf_import.unpermute_qk(data, config.num_heads)
            elif ".attn_k." in name:
                data = gguf_import.unpermute_qk(data, config.num_kv_heads)
            name = gguf_import.hf_tensor_name(name)
        tensors[name] = torch.from_numpy(np.array(data))  # a copy: the mapping is read-only
        if kind in _BLOCK_TYPES:
            formats[name] = _BLOCK_TYPES[kind]
    return tensors, formats


def load_gguf_model(model_dir: Path, gguf_path: Path, device: torch.device | str = "cpu") -> CausalLM:
    """The model of ``model_dir`` (config.json) with the weights of ``gguf_path`` as stored (see the
    module docstring); ``ValueError`` naming what does not fit."""
    config = ModelConfig.from_hf_dir(model_dir)
    tensors, formats = read_gguf(Path(gguf_path), config)
    with torch.device("meta"):
        model = CausalLM(config)
    matches, _, _ = match_checkpoint(model, tensors)  # load_hf_weights reports what is missing
    for target, (src, _) in matches.items():
        kinds = {formats.get(n) for n in src.names}
        if len(kinds) > 1:
            raise ValueError(f"{gguf_path.name}: {target} fuses tensors of different formats "
                             f"({', '.join(sorted(str(k) for k in kinds))})")
        fmt = kinds.pop()
        if fmt is not None:
            _store_as(model, target, fmt)
    load_hf_weights(model, tensors, dtype=torch.float32, device=device)
    model.rotary.to(device)
    return model.eval()


def _store_as(model: CausalLM, target: str, fmt: WeightFormat) -> None:
    """Make parameter ``target`` (still on meta) a ``fmt`` block tensor and tell its module."""
    modules = dict(model.named_modules())
    module_name, _, attr = target.rpartition(".")
    module = modules[module_name]
    old = getattr(module, attr)
    if target == "embed_tokens.weight":
        # its block-format twin (same forward, a block tensor for weight), not an nn.Embedding
        model.embed_tokens = GGUFEmbedding(old.shape[0], old.shape[1], fmt)  # type: ignore[assignment]
        if model.config.tie_word_embeddings:
            model.head_format = fmt
        return
    shape, dtype = fmt.storage(math.prod(old.shape[:-1]), old.shape[-1])
    setattr(module, attr, nn.Parameter(torch.empty((*old.shape[:-1], shape[-1]), dtype=dtype), requires_grad=False))
    if target == "lm_head.weight":
        model.head_format = fmt
    elif isinstance(module, SparseMoE):
        if module.weight_format not in (None, fmt):
            raise ValueError(f"{target}: the experts' gate/up and down tensors must share one format")
        module.weight_format = fmt
    elif isinstance(module, Linear):
        module.weight_format = fmt
    else:
        raise ValueError(f"{target}: no {fmt.name} kernel for a {type(module).__name__}")


def model_formats(model: CausalLM) -> set[WeightFormat]:
    """The block formats a model's matrices are stored in (empty for an unquantised model)."""
    found: set[WeightFormat] = {
        f for m in model.modules() if isinstance(f := getattr(m, "weight_format", None), WeightFormat)}
    if model.head_format is not None:
        found.add(model.head_format)
    return {f for f in found if f.quantized}


def gguf_file(model_dir: Path) -> Path:
    """The GGUF file ``quantization="gguf"`` serves for ``model_dir``: an embedded model's own
    (``registry.gguf_file``: smollm2-135m's is the wheel's Q4_1 file), else the directory's one
    ``*.gguf``; ``ValueError`` when there is none (or several)."""
    from execstate.model.registry import gguf_file as embedded_gguf

    found = embedded_gguf(model_dir)
    if found is not None:
        return found
    files = sorted(Path(model_dir).glob("*.gguf"))
    if len(files) != 1:
        raise ValueError(f"quantization='gguf' needs one .gguf file in {model_dir}, found {len(files)}")
    return files[0]
