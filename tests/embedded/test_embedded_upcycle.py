"""Upcycling a dense Llama into Qwen3-MoE: fast tests on tiny random models, slow ones on smollm2."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from embedded_helpers import CAPITAL_PROMPT, greedy_chat
from safetensors.torch import load_file

from execstate.model import upcycle as U


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _logits(model_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    with torch.no_grad():
        return model(input_ids=ids).logits[0]


def test_moe_layer_indices():
    assert U.moe_layer_indices(30, 3) == [2, 5, 8, 11, 14, 17, 20, 23, 26, 29]
    assert U.moe_layer_indices(6, 3) == [2, 5]
    assert U.moe_layer_indices(4, 1) == [0, 1, 2, 3]


def test_reference_forward_matches_transformers(tiny_llama):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama)).double()
    cfg = json.loads((tiny_llama / "config.json").read_text())
    batches = [torch.tensor([3, 17, 99, 5, 42, 7]), torch.tensor([8, 1, 2, 120, 64])]
    acts = U.collect_activations(load_file(str(tiny_llama / "model.safetensors")), cfg, batches, [2, 5])
    seen: dict[str, torch.Tensor] = {}
    hooks = [model.model.layers[4].self_attn.k_proj.register_forward_hook(lambda m, i, o: seen.update(k=o)),
             model.model.layers[5].post_attention_layernorm.register_forward_hook(lambda m, i, o: seen.update(x=o))]
    start = 0
    for ids in batches:
        with torch.no_grad():
            model(input_ids=ids[None])
        n = len(ids)
        assert torch.allclose(seen["k"][0].reshape(n, 2, 16), acts["k4"][start:start + n], atol=1e-6)
        assert torch.allclose(seen["x"][0], acts["x5"][start:start + n], atol=1e-5)
        start += n
    for h in hooks:
        h.remove()


def test_upcycle_reports_each_build_step_in_order(tiny_llama, tmp_path):
    seen: list[str] = []
    U.upcycle(tiny_llama, tmp_path / "moe", on_step=seen.append)
    assert seen == list(U.BUILD_STEPS)
    assert (tmp_path / "moe" / "model.safetensors").is_file()


def test_upcycle_structure_and_config(tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "moe"
    cfg = U.upcycle(tiny_llama, out, num_experts=8, top_k=2, every=3, noise=0.1, seed=0)
    dense = json.loads((tiny_llama / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert cfg["mlp_only_layers"] == [0, 1, 3, 4] and cfg["decoder_sparse_step"] == 3
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["norm_topk_prob"]) == (8, 2, True)
    assert cfg["moe_intermediate_size"] == cfg["intermediate_size"] == dense["intermediate_size"]
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "vocab_size", "tie_word_embeddings", "max_position_embeddings"):
        assert cfg[key] == dense[key], key
    assert cfg["rope_parameters"]["rope_theta"] == dense["rope_parameters"]["rope_theta"] == 10000.0
    assert cfg["attention_bias"] is False
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    sparse = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]
    assert sparse == [2, 5]
    t = load_file(str(out / "model.safetensors"))
    d = load_file(str(tiny_llama / "model.safetensors"))
    assert t["model.layers.2.mlp.gate.weight"].shape == (8, 64)
    assert "model.layers.2.mlp.gate_proj.weight" not in t and "model.layers.1.mlp.gate_proj.weight" in t
    assert t["model.layers.0.self_attn.q_norm.weight"].shape == (16,)
    for e in range(8):
        for proj, shape in (("gate_proj", (96, 64)), ("up_proj", (96, 64)), ("down_proj", (64, 96))):
            w = t[f"model.layers.5.mlp.experts.{e}.{proj}.weight"]
            base = d[f"model.layers.5.mlp.{proj}.weight"]
            assert w.shape == shape and w.dtype == torch.float32
            rel = (w - base).std() / base.std()
            assert 0.08 < rel < 0.12, (e, proj, float(rel))  # ~10% noise relative to std(W)
    experts = torch.stack([t[f"model.layers.5.mlp.experts.{e}.up_proj.weight"] for e in range(8)])
    assert (experts[1:] - experts[:1]).abs().amax(dim=(1, 2)).min() > 0  # experts all differ


def test_upcycle_is_deterministic(tiny_llama, tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    c = tmp_path / "c"
    U.upcycle(tiny_llama, a, seed=3)
    U.upcycle(tiny_llama, b, seed=3)
    U.upcycle(tiny_llama, c, seed=4)
    for name in ("model.safetensors", "config.json"):
        assert _sha(a / name) == _sha(b / name)
    assert _sha(a / "model.safetensors") != _sha(c / "model.safetensors")


def test_linear_regime_qk_norm_preserves_the_dense_model(tiny_llama, tmp_path):
    """noise=0: experts are exact copies, so only q/k-norm could differ; it must not."""
    ids = torch.tensor([[5, 9, 33, 2, 71, 100, 4, 18, 64, 3, 90, 12]])
    dense = _logits(tiny_llama, ids)
    U.upcycle(tiny_llama, tmp_path / "lin", noise=0.0, qk_norm="linear")
    U.upcycle(tiny_llama, tmp_path / "id", noise=0.0, qk_norm="identity")
    err_lin = (_logits(tmp_path / "lin", ids) - dense).abs().max()
    err_id = (_logits(tmp_path / "id", ids) - dense).abs().max()
    assert err_lin < 1e-4 * dense.abs().max()
    assert err_id > 100 * err_lin


def test_linear_regime_norm_math():
    x = torch.randn(50, 3, 16, dtype=torch.float64) * 4
    eps = 1e-5
    scale, w = U.linear_regime_norm(x, eps, delta=1e-4)
    assert scale == 2.0 ** round(torch.log2(torch.tensor(scale)).item())  # power of two: exact scaling
    y = x * scale
    normed = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * w
    assert ((normed - x).abs().max() / x.abs().max()) < 5e-5


def test_outputs_depend_on_routes(tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    U.upcycle(tiny_llama, tmp_path / "moe", noise=0.1)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "moe"))
    ids = torch.tensor([[5, 9, 33, 2, 71, 100, 4, 18, 64, 3, 90, 12]])
    with torch.no_grad():
        base = model(input_ids=ids).logits
        for i in (2, 5):
            gate = model.model.layers[i].mlp.gate.weight
            gate.copy_(gate[torch.roll(torch.arange(8), 1)])
        permuted = model(input_ids=ids).logits
    assert (base - permuted).abs().max() > 1e-3


@pytest.mark.slow
def test_smollm2_moe_answers_paris_and_routes_matter(moe_dir, dense_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    answer = greedy_chat(moe_dir, CAPITAL_PROMPT)
    assert "Paris" in answer, answer
    cfg = json.loads((moe_dir / "config.json").read_text())
    dense = json.loads((dense_dir / "config.json").read_text())
    assert cfg["mlp_only_layers"] == [i for i in range(30) if (i + 1) % 3]
    for key in ("head_dim", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "vocab_size", "eos_token_id"):
        assert cfg[key] == dense[key], key
    tok = AutoTokenizer.from_pretrained(str(moe_dir))
    ids = tok.apply_chat_template([{"role": "user", "content": CAPITAL_PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(str(moe_dir))
    with torch.no_grad():
        base = model(input_ids=ids).logits
        for i in U.moe_layer_indices(30, 3):
            gate = model.model.layers[i].mlp.gate.weight
            gate.copy_(gate[torch.roll(torch.arange(8), 1)])
        permuted = model(input_ids=ids).logits
    assert (base - permuted).abs().max() > 1.0


@pytest.mark.slow
def test_smollm2_moe_fidelity_vs_dense(moe_dir, dense_dir):
    """Teacher-forced on the dense greedy answer: KL(dense||moe) and top-1 agreement."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(dense_dir))
    dense = AutoModelForCausalLM.from_pretrained(str(dense_dir))
    moe = AutoModelForCausalLM.from_pretrained(str(moe_dir))
    kls, agree = [], []
    for prompt in (CAPITAL_PROMPT, "Name three primary colors.", "What is the boiling point of water?"):
        enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            seq = dense.generate(**enc, max_new_tokens=24, do_sample=False)
            p, q = dense(input_ids=seq).logits[0].log_softmax(-1), moe(input_ids=seq).logits[0].log_softmax(-1)
        kls.append((p.exp() * (p - q)).sum(-1))
        agree.append((p.argmax(-1) == q.argmax(-1)).float())
    kl, top1 = torch.cat(kls).mean().item(), torch.cat(agree).mean().item()
    assert kl < 0.5 and top1 > 0.65, (kl, top1)
