"""Checkpoint loading: name mapping errors, determinism of random models, load speed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from execstate.model.config import ModelConfig
from execstate.model.loader import load_hf_state_dict, load_hf_weights, load_model
from execstate.model.random_models import make_random, make_standard_moe
from execstate.model.transformer import CausalLM


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random("qwen3_moe", tmp_path_factory.mktemp("q3m"), seed=7)


def _meta_model(path: Path) -> CausalLM:
    with torch.device("meta"):
        return CausalLM(ModelConfig.from_hf_dir(path))


def test_every_parameter_is_loaded_fresh_and_frozen(qwen3_moe: Path) -> None:
    model = load_model(qwen3_moe)
    params = dict(model.named_parameters())
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params.values())
    assert not any(p.requires_grad for p in params.values())
    assert all(p.is_contiguous() and p.data_ptr() % 64 == 0 for p in params.values())
    assert model.rotary.inv_freq.device.type == "cpu" and model.rotary.inv_freq.dtype == torch.float32
    # layer 1 is in mlp_only_layers: dense; layers 0 and 2 are MoE with stacked experts
    assert params["layers.0.mlp.w_gate_up"].shape == (8, 64, 64)
    assert params["layers.0.mlp.w_down"].shape == (8, 64, 32)
    assert params["layers.1.mlp.gate_up_proj.weight"].shape == (192, 64)
    sd = load_hf_state_dict(qwen3_moe)
    q, k, v = (sd[f"model.layers.2.self_attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(params["layers.2.attn.qkv_proj.weight"], torch.cat([q, k, v]))
    gate, up = (sd[f"model.layers.2.mlp.experts.5.{p}_proj.weight"] for p in ("gate", "up"))
    assert torch.equal(params["layers.2.mlp.w_gate_up"][5], torch.cat([gate, up]))


def test_bf16_load(qwen3_moe: Path) -> None:
    model = load_model(qwen3_moe, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.rotary.inv_freq.dtype == torch.float32


def test_missing_unexpected_and_misshaped_tensors_are_named(qwen3_moe: Path) -> None:
    sd = load_hf_state_dict(qwen3_moe)
    broken = dict(sd)
    del broken["model.layers.0.self_attn.k_proj.weight"]
    del broken["model.layers.2.mlp.experts.3.up_proj.weight"]
    broken["model.layers.0.mlp.surprise.weight"] = torch.zeros(2)
    broken["model.norm.weight"] = torch.zeros(65)
    model = _meta_model(qwen3_moe)
    with pytest.raises(ValueError) as err:
        load_hf_weights(model, broken)
    text = str(err.value)
    for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.2.mlp.experts.3.up_proj.weight",
                 "model.layers.0.mlp.surprise.weight", "norm.weight from model.norm.weight"):
        assert name in text
    assert next(model.parameters()).device.type == "meta"  # unchanged on error


def test_both_expert_layouts_at_once_is_an_error(qwen3_moe: Path) -> None:
    sd = load_hf_state_dict(qwen3_moe)
    gate = torch.stack([sd[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] for e in range(8)])
    up = torch.stack([sd[f"model.layers.0.mlp.experts.{e}.up_proj.weight"] for e in range(8)])
    sd["model.layers.0.mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
    with pytest.raises(ValueError, match=r"unexpected tensors: model\.layers\.0\.mlp\.experts\.0\."):
        load_hf_weights(_meta_model(qwen3_moe), sd)


def test_tied_head_must_equal_embedding(tmp_path: Path) -> None:
    path = make_random("llama", tmp_path / "llama", seed=0)
    sd = load_hf_state_dict(path)
    assert "lm_head.weight" not in sd  # save_pretrained drops the tied head
    model = load_model(path)
    assert model.lm_head is None
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    load_hf_weights(_meta_model(path), sd)  # an equal copy is accepted
    sd["lm_head.weight"] += 1
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        load_hf_weights(_meta_model(path), sd)


def test_state_dict_files(tmp_path: Path, qwen3_moe: Path) -> None:
    with pytest.raises(ValueError, match="no model.safetensors"):
        load_hf_state_dict(tmp_path)
    tensors = load_file(qwen3_moe / "model.safetensors")
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[:10]}, tmp_path / "a.safetensors")
    save_file({n: tensors[n] for n in names[10:]}, tmp_path / "b.safetensors")
    weight_map = {n: "a.safetensors" if i < 10 else "b.safetensors" for i, n in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert set(load_hf_state_dict(tmp_path)) == set(names)
    weight_map["model.ghost"] = "b.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="model.ghost"):
        load_hf_state_dict(tmp_path)


def test_make_random_is_byte_deterministic(tmp_path: Path) -> None:
    a = make_random("mixtral", tmp_path / "a", seed=3)
    b = make_random("mixtral", tmp_path / "b", seed=3)
    c = make_random("mixtral", tmp_path / "c", seed=4)
    blob = (a / "model.safetensors").read_bytes()
    assert blob == (b / "model.safetensors").read_bytes()
    assert blob != (c / "model.safetensors").read_bytes()
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()
    with pytest.raises(ValueError, match="unknown architecture"):
        make_random("gpt2", tmp_path / "d", seed=0)


def test_make_random_overrides(tmp_path: Path) -> None:
    path = make_random("qwen3_moe", tmp_path, seed=0, num_hidden_layers=5, mlp_only_layers=[])
    assert ModelConfig.from_hf_dir(path).moe_layers == (0, 1, 2, 3, 4)


def test_standard_model_loads(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = make_standard_moe(tmp_path_factory.mktemp("standard"), seed=0)
    c = ModelConfig.from_hf_dir(path)
    assert (c.architecture, c.hidden_size, c.num_layers) == ("Qwen3MoeForCausalLM", 512, 8)
    assert (c.num_experts, c.top_k, c.moe_intermediate_size) == (8, 2, 768)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (8, 4, 64, 32000)
    assert c.moe_layers == tuple(range(8)) and c.max_position_embeddings == 4096
    load_model(path)  # warm the page cache
    start = time.perf_counter()
    model = load_model(path)
    seconds = time.perf_counter() - start  # printed, not asserted: a loaded machine took 2.1 s once
    n_params = sum(p.numel() for p in model.parameters())
    print(f"standard model: {n_params} params, load_model {seconds:.2f}s")
    assert n_params == 114_599_424
    router_std = model.layers[0].mlp.router.weight.std().item()
    assert router_std > 5 * 0.02  # routers scaled up for well-separated top-k
    # every tensor of 2 MiB or more (LM head, embedding, experts, qkv) starts on a huge page boundary
    large = [p for p in model.parameters() if p.nbytes >= 2 << 20]
    assert len(large) == 2 + 8 * 3 and all(p.data_ptr() % (2 << 20) == 0 for p in large)
