"""RoPE frequencies and cos/sin match transformers 5.23 bitwise for every supported type."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from execstate.model.config import ModelConfig
from execstate.model.rotary import RotaryEmbedding, rope_inv_freq

BASE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
ROPES = [
    {"rope_type": "default", "rope_theta": 500000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 512,
     "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "attention_factor": 1.3},
]


@pytest.mark.parametrize("rope", range(len(ROPES)))
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3MoeForCausalLM"])
def test_inv_freq_matches_transformers(rope: int, arch: str) -> None:
    cls = transformers.LlamaConfig if arch == "LlamaForCausalLM" else transformers.Qwen3MoeConfig
    extra = {} if arch == "LlamaForCausalLM" else {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2}
    hf = cls(**BASE, **extra, rope_parameters=copy.deepcopy(ROPES[rope]))
    rope_type = hf.rope_parameters["rope_type"]
    if rope_type == "default":
        dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        want = 1.0 / (hf.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        want_scale = 1.0
    else:
        want, want_scale = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    ours = ModelConfig.from_dict({**hf.to_dict(), "architectures": [arch]})
    got, scale = rope_inv_freq(ours)
    assert torch.equal(got, want)
    assert scale == pytest.approx(want_scale, abs=0)


def test_cos_sin_matches_transformers_rotary_module() -> None:
    hf_cfg = transformers.LlamaConfig(**BASE, rope_parameters=copy.deepcopy(ROPES[2]))
    hf_rot = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf_cfg)
    ours = RotaryEmbedding(ModelConfig.from_dict({**hf_cfg.to_dict(), "architectures": ["LlamaForCausalLM"]}))
    pos = torch.tensor([0, 1, 7, 100, 1023, 3000, 4095])
    for dtype in (torch.float32, torch.bfloat16):
        want_cos, want_sin = hf_rot(torch.zeros(1, dtype=dtype), pos[None])
        cos, sin = ours.cos_sin(pos, dtype)
        assert torch.equal(cos[:, 0], want_cos[0]) and torch.equal(sin[:, 0], want_sin[0])
