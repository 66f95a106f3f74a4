"""Helpers shared by the embedded-model tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

from pathlib import Path

import torch

CAPITAL_PROMPT = "What is the capital of France?"


def make_tiny_llama(out_dir: Path, seed: int = 0, layers: int = 6, tie: bool = True) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # non-trivial norm weights, so the norms are exercised
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out_dir)
    return out_dir


def greedy_chat(model_dir: Path, prompt: str = CAPITAL_PROMPT, max_new_tokens: int = 24) -> str:
    """Greedy answer of the transformers model in ``model_dir`` to one chat-templated user turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0][enc["input_ids"].shape[1]:], skip_special_tokens=True)
