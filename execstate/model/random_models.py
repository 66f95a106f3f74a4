"""Tiny random HF checkpoints for tests and benchmarks, built with transformers (no download).

``make_random(arch, out_dir, seed)`` writes a tiny model of one supported family with
``save_pretrained`` (config.json + model.safetensors); ``make_standard_moe`` writes the
benchmark's standard Qwen3-MoE. Weights come from a ``torch.Generator`` seeded with
``seed``, filled in sorted parameter-name order, so the same seed (and transformers
version) gives byte-identical files.

Router weights are scaled so router logits have a standard deviation of about
``ROUTER_LOGIT_STD``: top-k choices are well separated (not near-uniform), so route
equality tests are stable against ~1e-6 numerical noise.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import transformers

ARCHITECTURES: tuple[str, ...] = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "llama", "qwen3")
ROUTER_LOGIT_STD = 3.0

_COMMON: dict[str, Any] = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                               tie_word_embeddings=False)
# Tiny configs: every family-specific feature the model layer implements is exercised by
# at least one of them (yarn / llama3 / linear RoPE, head_dim != hidden/heads,
# mlp_only_layers, decoder_sparse_step, shared expert, q/k/v and o biases, OLMoE's
# whole-projection QK-norm and clip_qkv, tied embeddings, norm_topk_prob both ways).
_TINY: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        num_hidden_layers=3, head_dim=32, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=64))),
    "qwen2_moe": ("Qwen2MoeConfig", dict(
        num_hidden_layers=4, decoder_sparse_step=2, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2, qkv_bias=True)),
    "mixtral": ("MixtralConfig", dict(
        num_hidden_layers=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", dict(
        num_hidden_layers=2, intermediate_size=32, num_experts=8, num_experts_per_tok=2, clip_qkv=1.5)),
    "llama": ("LlamaConfig", dict(
        num_hidden_layers=2, intermediate_size=96, attention_bias=True, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64))),
    "qwen3": ("Qwen3Config", dict(
        num_hidden_layers=2, head_dim=16, intermediate_size=96,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
}


def _is_router(name: str) -> bool:
    return name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight"))


@torch.no_grad()
def _fill(model: transformers.PreTrainedModel, seed: int, std: float | None) -> None:
    """Deterministic init. ``std=None``: fan-in scaling (each sublayer contributes O(1), so
    a wrong route or weight shows in the logits); else plain ``N(0, std)``."""
    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    for name, p in sorted(model.named_parameters()):
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight") or "layernorm" in name:
            value = 1.0 + 0.1 * noise
        elif _is_router(name):
            value = noise * (ROUTER_LOGIT_STD / math.sqrt(hidden))
        elif name.endswith("bias"):
            value = noise * 0.02
        elif std is not None:
            value = noise * std
        else:
            value = noise / math.sqrt(p.shape[-1])
        p.copy_(value)


def _build(config_cls: str, config_kwargs: dict[str, Any], out_dir: str | Path, seed: int,
           std: float | None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = getattr(transformers, config_cls)(**config_kwargs)
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # skipped under no_init_weights; tied params must be one tensor
    _fill(model, seed, std)
    model.save_pretrained(out)
    return out


def make_random(arch: str, out_dir: str | Path, seed: int, **overrides: Any) -> Path:
    """Write a tiny random ``arch`` model (see ``ARCHITECTURES``) to ``out_dir``; returns it.

    ``overrides`` replace keys of the transformers config (e.g. ``num_hidden_layers=4``).
    Weights use fan-in scaling (std ``1/sqrt(last dim)``, embeddings included), norms
    ``1 + N(0, 0.1)``, biases ``N(0, 0.02)`` and scaled-up routers.
    """
    if arch not in _TINY:
        raise ValueError(f"unknown architecture {arch!r} (known: {', '.join(ARCHITECTURES)})")
    config_cls, kwargs = _TINY[arch]
    return _build(config_cls, {**_COMMON, **kwargs, **overrides}, out_dir, seed, std=None)


def make_standard_moe(out_dir: str | Path, seed: int) -> Path:
    """The benchmark's standard model: Qwen3-MoE, hidden 512, 8 layers, 8 experts top-2,
    8 heads / 4 kv heads, head_dim 64, moe_intermediate_size 768, vocab 32000, 4096
    positions; weights ``N(0, 0.02)`` (norms ``1 + N(0, 0.1)``, routers scaled up)."""
    kwargs = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=64, intermediate_size=1536, moe_intermediate_size=768,
                  num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=4096,
                  rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    return _build("Qwen3MoeConfig", kwargs, out_dir, seed, std=0.02)
