"""GGUF import of SmolLM2-135M-Instruct: weights vs transformers' GGUF loader, config, tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from embedded_helpers import CAPITAL_PROMPT, greedy_chat

from execstate.model import gguf_import as G

TEXTS = (
    CAPITAL_PROMPT,
    "In 2024, 12345 apples cost $3.50 each; x² = 4 — naïve café, 東京, emoji 🙂.",
    "<|im_start|>user\nhi there<|im_end|>\n  def f(x):\n\treturn x  # tabs & spaces\n",
)


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (applied to HF q/k weights)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_head,rows", [(9, 576), (3, 192), (4, 64)])
def test_unpermute_inverts_llama_cpp_and_matches_transformers(n_head, rows):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    w = np.random.default_rng(0).standard_normal((rows, 32)).astype(np.float32)
    permuted = _llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(G.unpermute_qk(permuted, n_head), w)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(permuted, n_head, n_head)
    assert np.array_equal(G.unpermute_qk(permuted, n_head), theirs)


def test_tensor_names():
    assert G.hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert G.hf_tensor_name("blk.7.attn_k.weight") == "model.layers.7.self_attn.k_proj.weight"
    assert G.hf_tensor_name("blk.29.ffn_down.weight") == "model.layers.29.mlp.down_proj.weight"
    assert G.hf_tensor_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(KeyError):
        G.hf_tensor_name("blk.0.attn_qkv.weight")


def test_find_packaged_gguf_errors_name_the_package():
    with pytest.raises(FileNotFoundError, match="no_such_pkg_xyz"):
        G.find_packaged_gguf("no_such_pkg_xyz")


@pytest.mark.slow
def test_import_reports_each_build_step_in_order(tmp_path):
    seen: list[str] = []
    G.import_gguf(G.find_packaged_gguf(), tmp_path / "m", on_step=seen.append)
    assert seen == list(G.BUILD_STEPS)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in (tmp_path / "m").iterdir()}


@pytest.mark.slow
def test_weights_and_config_match_transformers_gguf_loader():
    """Every tensor of our dequant+rename+unpermute equals transformers' GGUF loader's (oracle)."""
    import torch
    from gguf import GGUFReader
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = G.find_packaged_gguf()
    reader = GGUFReader(str(path))
    cfg = G.read_config(reader)
    ours = G.convert_weights(reader, cfg)
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "rope_theta"}))
    oracle = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)
    theirs = oracle["tensors"]
    assert set(ours) == set(theirs) and len(ours) == 272
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and tensor.shape == theirs[name].shape, name
        assert torch.equal(tensor, theirs[name].float()), name
    expected = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "intermediate_size": 1536, "head_dim": 64, "max_position_embeddings": 8192, "vocab_size": 49152,
                "rope_theta": 100000.0, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
                "pad_token_id": 2}
    for key, value in expected.items():
        assert cfg[key] == value, key
        assert oracle["config"][key] == value, key
    assert cfg["rms_norm_eps"] == 1e-5 and np.float32(oracle["config"]["rms_norm_eps"]) == np.float32(1e-5)
    assert "lm_head.weight" not in ours


@pytest.mark.slow
def test_prepared_dense_dir(dense_dir):
    from transformers import AutoConfig

    names = {p.name for p in dense_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "generation_config.json", "execstate_model.json"} <= names
    cfg = AutoConfig.from_pretrained(str(dense_dir))
    assert cfg.architectures == ["LlamaForCausalLM"] and cfg.rope_parameters["rope_theta"] == 100000.0
    assert cfg.rms_norm_eps == 1e-5 and cfg.tie_word_embeddings is True


@pytest.mark.slow
def test_tokenizer_matches_transformers_gguf_tokenizer(dense_dir):
    import jinja2
    from gguf import GGUFReader
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    path = G.find_packaged_gguf()
    plain = Tokenizer.from_file(str(dense_dir / "tokenizer.json"))
    saved = AutoTokenizer.from_pretrained(str(dense_dir))
    oracle = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ids = plain.encode(text).ids
        assert ids == saved(text)["input_ids"] == oracle(text)["input_ids"], text
        assert plain.decode(ids, skip_special_tokens=False) == text
    assert plain.encode(CAPITAL_PROMPT).ids == [1780, 314, 260, 3575, 282, 4649, 47]
    assert plain.encode(" 2024").ids == plain.encode(" ").ids + [plain.token_to_id(c) for c in "2024"]
    template = GGUFReader(str(path)).fields["tokenizer.chat_template"].contents()
    assert (dense_dir / "chat_template.jinja").read_text() == template
    assert json.loads((dense_dir / "tokenizer_config.json").read_text())["chat_template"] == template
    messages = [{"role": "user", "content": CAPITAL_PROMPT}]
    rendered = jinja2.Template(template).render(messages=messages, add_generation_prompt=True)
    assert saved.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == rendered
    assert saved.eos_token == "<|im_end|>" and saved.eos_token_id == 2


@pytest.mark.slow
def test_smollm2_135m_answers_paris(dense_dir):
    answer = greedy_chat(dense_dir)
    assert "Paris" in answer, answer
