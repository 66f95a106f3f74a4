"""ModelConfig parses config.json dicts exactly as transformers 5.23 does."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from execstate.model.config import ModelConfig

HF_CLASSES = {
    "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
    "Qwen2MoeForCausalLM": transformers.Qwen2MoeConfig,
    "MixtralForCausalLM": transformers.MixtralConfig,
    "OlmoeForCausalLM": transformers.OlmoeConfig,
    "LlamaForCausalLM": transformers.LlamaConfig,
    "Qwen3ForCausalLM": transformers.Qwen3Config,
}
SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
             num_experts_per_tok=2)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}

CASES = [
    {},  # every field from the architecture's defaults
    SMALL,
    {**SMALL, "num_experts": 4},
    {**SMALL, "num_local_experts": 6},
    {**SMALL, "num_experts": 4, "num_local_experts": 6},
    {**SMALL, "rope_theta": 5000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    {**SMALL, "rope_theta": 5000.0, "rope_scaling": dict(LLAMA3)},
    {**SMALL, "rope_parameters": {"rope_type": "linear", "factor": 3.0}},
    {**SMALL, "rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 7.0},
     "rope_theta": 9.0},
    {**SMALL, "rope_parameters": {"rope_type": "linear", "factor": 2.0},
     "rope_scaling": {"rope_type": "linear", "factor": 3.0}},
    {**SMALL, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "max_position_embeddings": 1024},
    {**SMALL, "head_dim": 32, "eos_token_id": [5, 7], "bos_token_id": 3, "tie_word_embeddings": True},
    {**SMALL, "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": True},
    {**SMALL, "attention_bias": True, "qkv_bias": False},
]


def _hf_expected(arch: str, d: dict) -> dict:
    c = HF_CLASSES[arch].from_dict(copy.deepcopy(d))
    rope = dict(c.rope_parameters)
    theta = rope.pop("rope_theta")
    rope.pop("type", None)
    eos = c.eos_token_id
    exp = dict(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads or c.num_attention_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        intermediate_size=c.intermediate_size, rms_norm_eps=c.rms_norm_eps, rope_theta=theta,
        rope_scaling=None if rope["rope_type"] == "default" else rope,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
        eos_token_ids=() if eos is None else (eos,) if isinstance(eos, int) else tuple(eos),
        bos_token_id=c.bos_token_id,
    )
    if arch == "MixtralForCausalLM":
        exp.update(num_experts=c.num_local_experts, top_k=c.num_experts_per_tok, norm_topk_prob=True)
    elif "Moe" in arch:
        exp.update(num_experts=c.num_experts, top_k=c.num_experts_per_tok, norm_topk_prob=c.norm_topk_prob)
    if arch == "Qwen2MoeForCausalLM":
        exp.update(attention_bias=c.qkv_bias, attention_out_bias=False)
    elif arch != "MixtralForCausalLM":
        exp.update(attention_bias=c.attention_bias, attention_out_bias=c.attention_bias)
    return exp


@pytest.mark.parametrize("arch", list(HF_CLASSES))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fields_match_transformers(arch: str, case: int) -> None:
    d = {**copy.deepcopy(CASES[case]), "architectures": [arch]}
    if arch == "OlmoeForCausalLM" and "head_dim" in d:  # transformers builds q_norm of the wrong size
        with pytest.raises(ValueError, match="head_dim"):
            ModelConfig.from_dict(d)
        return
    ours = ModelConfig.from_dict(copy.deepcopy(d))
    expected = _hf_expected(arch, d)
    got = {k: getattr(ours, k) for k in expected}
    assert got == expected


MOE_LAYER_CASES = [
    ("Qwen3MoeForCausalLM", {}),
    ("Qwen3MoeForCausalLM", {"mlp_only_layers": [1]}),
    ("Qwen3MoeForCausalLM", {"decoder_sparse_step": 2}),
    ("Qwen3MoeForCausalLM", {"decoder_sparse_step": 3, "mlp_only_layers": [2, 4]}),
    ("Qwen3MoeForCausalLM", {"num_experts": 0}),
    ("Qwen2MoeForCausalLM", {"decoder_sparse_step": 2, "mlp_only_layers": [3]}),
    ("MixtralForCausalLM", {}),
    ("OlmoeForCausalLM", {}),
    ("LlamaForCausalLM", {}),
    ("Qwen3ForCausalLM", {}),
]


@pytest.mark.parametrize(("arch", "extra"), MOE_LAYER_CASES)
def test_moe_layers_match_transformers_modules(arch: str, extra: dict) -> None:
    d = {**SMALL, "num_hidden_layers": 6, "num_experts": 4, "num_local_experts": 4, "vocab_size": 32,
         "intermediate_size": 16, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8,
         "num_experts_per_tok": 2, **extra, "architectures": [arch]}
    if "Moe" not in arch and "Mixtral" not in arch:
        for k in ("num_experts", "num_local_experts", "moe_intermediate_size", "num_experts_per_tok"):
            d.pop(k)
    ours = ModelConfig.from_dict(copy.deepcopy(d))
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(HF_CLASSES[arch].from_dict(copy.deepcopy(d)))
    hf_moe = tuple(i for i, layer in enumerate(hf.model.layers) if hasattr(layer.mlp, "experts"))
    assert ours.moe_layers == hf_moe
    assert ours.num_moe_layers == len(hf_moe)
    assert ours.is_moe == bool(hf_moe)


def test_qk_norm_per_architecture() -> None:
    flags = {a: (c.qk_norm, c.qk_norm_per_head) for a in HF_CLASSES
             for c in [ModelConfig.from_dict({**SMALL, "architectures": [a]})]}
    assert flags["Qwen3MoeForCausalLM"] == (True, True)
    assert flags["Qwen3ForCausalLM"] == (True, True)
    assert flags["OlmoeForCausalLM"] == (True, False)  # over the whole projection
    assert not flags["LlamaForCausalLM"][0] and not flags["MixtralForCausalLM"][0]
    assert not flags["Qwen2MoeForCausalLM"][0]


def test_from_hf_dir(tmp_path) -> None:
    transformers.Qwen3MoeConfig(**SMALL, num_experts=4).save_pretrained(tmp_path)
    c = ModelConfig.from_hf_dir(tmp_path)
    # save_pretrained writes the Qwen3-MoE expert count as `num_local_experts`
    assert c.architecture == "Qwen3MoeForCausalLM" and c.num_experts == 4 and c.top_k == 2
    with pytest.raises(ValueError, match="no config.json"):
        ModelConfig.from_hf_dir(tmp_path / "nowhere")


@pytest.mark.parametrize(("d", "match"), [
    ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
    ({}, "exactly one architecture"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"}, "hidden_act"),
    ({"architectures": ["LlamaForCausalLM"], "mlp_bias": True}, "mlp_bias"),
    ({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "dynamic"),
    ({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "linear"}}, "factor"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "use_sliding_window": True}, "sliding"),
    ({"architectures": ["MixtralForCausalLM"], "sliding_window": 4096}, "sliding"),
    ({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 5},
     "multiple"),
    ({"architectures": ["MixtralForCausalLM"], "num_experts_per_tok": 9}, "top_k"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 0}, "decoder_sparse_step"),
    ({"architectures": ["LlamaForCausalLM"], "vocab_size": 0}, "vocab_size"),
])
def test_invalid_configs_raise(d: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict(d)
