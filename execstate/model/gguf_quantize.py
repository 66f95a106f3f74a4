"""Quantise an HF checkpoint into a GGUF file of Q8_0 / Q4_0 / Q4_1 blocks (the ``smollm2-moe-q8_0`` /
``smollm2-moe-q4_1`` builds), served with ``quantization="gguf"`` (``model/gguf_model.py``).

``quantize_checkpoint(src_dir, out_dir, fmt, embedding_fmt)`` copies ``src_dir``'s config and
tokenizer files and writes ``out_dir/model.gguf`` (``gguf.GGUFWriter``, HF tensor names):

- every matrix (2-D, columns a multiple of 32) quantised by the ``gguf`` package's quantiser
  (``gguf.quants.quantize``) in ``fmt``, the token embedding (and an untied LM head) in
  ``embedding_fmt``;
- kept float32: 1-D tensors (norms), the MoE routers and shared-expert gates (routing stays
  fp32), matrices whose columns are not a multiple of 32, and any group of matrices that share
  a kernel (q|k|v, gate|up, a layer's experts) where one member quantises worse than ``QUALITY_LIMIT``
  (relative Frobenius error of quantise -> dequantise). smollm2-moe's q/k projections are scaled
  by 2^-17 (``upcycle.py``'s linear QK-norm): their Q8_0 scales are fp16 subnormals (error 0.55-0.66),
  so its Q8_0 build keeps q|k|v in fp32; in Q4_1 they quantise at 0.07-0.08, like any matrix.
The choices are recorded in the file (``execstate.float32_tensors``) and in ``quantization.json``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from execstate.kernels.weight_format import WeightFormat
from execstate.model.checkpoint_files import load_hf_state_dict

RECIPE_VERSION = 1
BUILD_STEPS = ("reading the float32 checkpoint", "quantising the matrices with the gguf package", "writing model.gguf")
# Largest relative error (||w - dequant(quant(w))|| / ||w||) accepted per format; beyond, fp32.
QUALITY_LIMIT = {WeightFormat.Q8_0: 0.02, WeightFormat.Q4_0: 0.15, WeightFormat.Q4_1: 0.15}
# MoE routers and the shared-expert gate (kept fp32: routing decisions are not quantised)
_GATES = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate.weight")
_FUSED_SUFFIXES = ((".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight"),
                   (".gate_proj.weight", ".up_proj.weight"))


def _ggml(fmt: WeightFormat):  # noqa: ANN202 - gguf's enum
    import gguf

    return getattr(gguf.GGMLQuantizationType, fmt.name)


def _group(name: str) -> str:
    """The key of the group of tensors that must share one format with ``name`` (itself when none):
    q|k|v and gate|up are fused at load, and one MoE layer's experts (gate, up and down) are one
    kernel call."""
    if ".experts." in name:
        return name[: name.index(".experts.")] + "|experts"
    for suffixes in _FUSED_SUFFIXES:
        for suffix in suffixes:
            if name.endswith(suffix):
                return name[: -len(suffix)] + "|".join(suffixes)
    return name


def plan_formats(state: dict[str, np.ndarray], fmt: WeightFormat, embedding_fmt: WeightFormat
                 ) -> tuple[dict[str, WeightFormat | None], dict[str, float], dict[str, np.ndarray]]:
    """(tensor -> format or None for float32, tensor -> relative quantisation error, tensor -> its
    blocks where quantised) (see the module docstring)."""
    from gguf.quants import dequantize, quantize

    want: dict[str, WeightFormat | None] = {}
    errors: dict[str, float] = {}
    blocks: dict[str, np.ndarray] = {}
    for name, w in state.items():
        target = embedding_fmt if name in ("model.embed_tokens.weight", "lm_head.weight") else fmt
        if w.ndim != 2 or w.shape[1] % 32 or name.endswith(_GATES):
            want[name] = None
            continue
        ggml = _ggml(target)
        blocks[name] = quantize(w, ggml)
        back = dequantize(blocks[name], ggml)
        errors[name] = float(np.linalg.norm(back - w) / max(float(np.linalg.norm(w)), 1e-30))
        want[name] = target if errors[name] <= QUALITY_LIMIT[target] else None
    groups: dict[str, list[str]] = {}
    for name in want:
        groups.setdefault(_group(name), []).append(name)
    for members in groups.values():
        if len(members) > 1 and any(want[n] is None for n in members):
            for n in members:
                want[n] = None
    return want, errors, blocks


def quantize_checkpoint(src_dir: Path, out_dir: Path, fmt: WeightFormat, embedding_fmt: WeightFormat,
                        on_step: Callable[[str], None] | None = None) -> dict[str, WeightFormat | None]:
    """Write ``out_dir`` (config, tokenizer, ``model.gguf``, ``quantization.json``); returns the plan."""
    import gguf

    step = on_step or (lambda _: None)
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    step(BUILD_STEPS[0])
    for f in src_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("execstate_model.json",
                                                                                   "model.safetensors.index.json"):
            shutil.copyfile(f, out_dir / f.name)
    state = {k: v.numpy() for k, v in load_hf_state_dict(src_dir).items()}
    step(BUILD_STEPS[1])
    plan, errors, blocks = plan_formats(state, fmt, embedding_fmt)
    step(BUILD_STEPS[2])
    writer = gguf.GGUFWriter(str(out_dir / "model.gguf"), arch="execstate")
    writer.add_string("execstate.float32_tensors", ",".join(sorted(n for n, f in plan.items() if f is None)))
    for name in sorted(state):
        planned = plan[name]
        if planned is None:
            writer.add_tensor(name, np.ascontiguousarray(state[name], dtype=np.float32))
        else:
            writer.add_tensor(name, blocks[name], raw_dtype=_ggml(planned))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    summary = {"format": fmt.name, "embedding": embedding_fmt.name,
               "float32": sorted(n for n, f in plan.items() if f is None and state[n].ndim == 2),
               "max_relative_error": {k.name: max((e for n, e in errors.items() if plan[n] is k), default=0.0)
                                      for k in {f for f in plan.values() if f is not None}}}
    (out_dir / "quantization.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return plan
