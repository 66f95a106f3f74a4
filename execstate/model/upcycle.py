"""Sparse upcycling of a dense HF Llama checkpoint into a Qwen3-MoE checkpoint (``smollm2-moe``).

Construction (``upcycle``; defaults = the embedded ``smollm2-moe`` recipe, seed 0):

- MoE layers: ``(i + 1) % every == 0`` -> layers 2, 5, 8, ..., 29 of SmolLM2's 30 (10 MoE layers).
  ``decoder_sparse_step = every`` AND ``mlp_only_layers`` = all other layers, so both of Qwen3-MoE's
  rules agree; dense layers keep the original MLP at ``intermediate_size``.
- Experts: E=8 copies of the layer's MLP (``moe_intermediate_size = intermediate_size``), each
  ``W * (1 + a*N1) + a*std(W)*N2`` with ``a = 0.1/sqrt(2)`` (total noise 10% of std(W)), numpy
  PCG64 streams seeded by (seed, layer, expert, matrix). Top-2, ``norm_topk_prob=True``, no shared
  expert. 320.4M parameters (dense: 134.5M).
- Router ``mlp.gate.weight [E, H]``: Gaussian rows divided by each input dim's std over the
  calibration tokens, projected orthogonal to the mean router input, scaled so logits have std
  4 on the calibration tokens. Measured in the embedded model (10 MoE layers x 529 tokens of 8
  held-out chat prompts + dense answers): logit std 4.0; gap between 2nd and 3rd logit median
  1.13, 5.5% < 0.1, 0.8% < 0.01; mean top-1 weight 0.81; expert load 4.7%..24% of slots per
  layer (uniform = 12.5%).
- QK-norm: Qwen3-MoE RMS-normalises q and k per head (``q_norm``/``k_norm``, eps = the model's
  rms_norm_eps = 1e-5) before RoPE; Llama does not. Measured with noise 0 (experts = exact copies,
  so only attention differs), 6 held-out prompts, 344 teacher-forced positions, KL(dense||moe):
    identity weights:                  KL 2.77, top-1 23.5%, answers are empty strings;
    per-dim least-squares calibration: KL 1.53, top-1 37.5%, fluent nonsense (``fit_head_norm``).
  RMSNorm removes each token's q/k magnitude, which attention relies on, so no per-dim weight can
  repair it. Used instead (``qk_norm="linear"``): run the norm in its linear regime. q_proj/k_proj
  rows are scaled by a power of two ``s`` (exact) chosen so ``s^2 * mean(q^2) <= 1e-4 * eps`` for
  every calibration row, and the norm weight is ``sqrt(eps)/s``; then
  ``q_norm(s*q) = q / sqrt(1 + s^2*mean(q^2)/eps)`` = q to within 5e-5. Result: noise 0 gives
  KL 0.0000 / top-1 100%. For SmolLM2, s = 2^-17 in every layer (q/k weights ~1e-5..1e-10,
  norm weights 414.5). fp32 and bf16 hold these fine; in fp16 those weights are subnormal (~1%
  relative error, 2% flush to zero; measured: still answers Paris, 97% top-1 vs fp32 on the prompt).
  A runtime that skips q/k-norm or uses another eps is visibly wrong (q, k scale by ~sqrt(eps ratio)).
- Statistics (q/k RMS, router input mean/std) come from a float64 reference forward of the dense
  model (``collect_activations``, no transformers) over ``CALIBRATION_TEXTS`` (315 tokens), or 4x64
  seeded random ids when the source has no tokenizer (tiny random test models).
- Config carries over hidden/heads/kv heads/head_dim/rope theta/rms eps/vocab/context/
  tie_word_embeddings/bos/eos/pad; attention_bias=False; no sliding window. The checkpoint uses the
  hub layout (``mlp.experts.{e}.{gate,up,down}_proj.weight``, ``mlp.gate.weight``); transformers
  5.23 fuses experts on load with no missing/unexpected keys.
- Deterministic: same inputs + seed -> identical bytes (elementwise float32 noise, fp64 stats).

Measured fidelity of the embedded smollm2-moe vs smollm2-135m (fp32, transformers 5.23, 8 chat
prompts, 529 teacher-forced positions on the dense model's greedy answers): KL mean 0.161, median
0.100, p90 0.452; top-1 agreement 80.0%. "What is the capital of France?" -> dense "The capital of
France is Paris.", MoE "The capital of France is Paris, France." Rolling the router rows of all
MoE layers by one changes the logits (max |delta| 13.3, top-1 agreement 68% on that prompt) and
the answer ("L'Étoile (The City of Lights) is the capital of France, ..."): outputs follow routes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

RECIPE_VERSION = 1  # bump whenever the output bytes change (cached builds rebuild)
# What ``upcycle`` reports to its ``on_step`` callback, in order (build progress).
BUILD_STEPS = (
    "loading the dense checkpoint",
    "calibrating q/k norms and routers on sample text (float64 forward of the dense model)",
    "making routers and seeded expert copies",
    "writing model.safetensors",
)

# Calibration text: run through the *dense* model (float64) to fit q_norm/k_norm and the routers.
CALIBRATION_TEXTS = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nCan you explain how photosynthesis works?<|im_end|>\n<|im_start|>assistant\n"
    "Photosynthesis is the process plants use to turn sunlight, water and carbon dioxide into sugar "
    "and oxygen. It happens mostly in the leaves, inside small structures called chloroplasts.<|im_end|>\n",
    "The history of the city goes back more than two thousand years. Merchants arrived by river, "
    "built warehouses along the banks, and slowly the small trading post grew into a busy town with "
    "markets, churches, schools and a university that still stands today.",
    "<|im_start|>user\nWrite a Python function that returns the sum of a list.<|im_end|>\n"
    "<|im_start|>assistant\ndef total(values):\n    result = 0\n    for v in values:\n"
    "        result += v\n    return result\n<|im_end|>\n",
    "In 1969, astronauts landed on the Moon for the first time. The mission took eight days, "
    "covered about 384,000 kilometres each way, and was watched on television by 600 million people.",
    "<|im_start|>user\nGive me three tips for sleeping better.<|im_end|>\n<|im_start|>assistant\n"
    "1. Go to bed at the same time every night.\n2. Avoid screens for an hour before sleep.\n"
    "3. Keep your bedroom cool, dark and quiet.<|im_end|>\n",
    "Dear Maria, thank you for your letter. We were so happy to hear about your new job! The weather "
    "here has been cold and rainy, but the children are enjoying school and send their love.",
)


def moe_layer_indices(num_layers: int, every: int) -> list[int]:
    """Layers that become MoE: (i + 1) % every == 0, i.e. 2, 5, 8, ... for every=3.

    This is exactly Qwen3-MoE's ``decoder_sparse_step`` rule, so the config is self-consistent.
    """
    return [i for i in range(num_layers) if (i + 1) % every == 0]


def calibration_batches(src_dir: Path, vocab_size: int, seed: int) -> list[torch.Tensor]:
    """Token ids for calibration: CALIBRATION_TEXTS via the source tokenizer, else seeded ids."""
    tok_path = Path(src_dir) / "tokenizer.json"
    if tok_path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_path))
        return [torch.tensor(tok.encode(t).ids) for t in CALIBRATION_TEXTS]
    rng = np.random.default_rng([seed, 7])
    return [torch.from_numpy(rng.integers(0, vocab_size, size=64)) for _ in range(4)]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """HF Llama rotary embedding (rotate_half convention) for x ``[T, heads, head_dim]``."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.to(torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rot * sin


@torch.no_grad()
def collect_activations(sd: dict[str, torch.Tensor], cfg: dict[str, Any], batches: list[torch.Tensor],
                        layers: list[int]) -> dict[str, torch.Tensor]:
    """Float64 reference forward of the dense Llama over ``batches`` (no transformers involved).

    All sequences go through together (block-diagonal causal mask). Returns per layer
    ``q{i}``/``k{i}`` (``[T, heads, head_dim]``, before RoPE: what q_norm/k_norm see) and, for MoE
    layers, ``x{i}`` (``[T, H]``, the post-attention-norm MLP input = router input).
    """
    nh, nkv, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    p = {k: v.to(torch.float64) for k, v in sd.items()}
    ids = torch.cat(batches)
    seq = torch.cat([torch.full((len(b),), j) for j, b in enumerate(batches)])
    pos = torch.cat([torch.arange(len(b)) for b in batches])
    t = ids.shape[0]
    allowed = (seq[:, None] == seq[None]) & (pos[:, None] >= pos[None])
    mask = torch.zeros(t, t, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    acts: dict[str, torch.Tensor] = {}
    h = p["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        x = _rms(h, p[pre + "input_layernorm.weight"], eps)
        q = acts[f"q{i}"] = (x @ p[pre + "self_attn.q_proj.weight"].T).reshape(t, nh, hd)
        k = acts[f"k{i}"] = (x @ p[pre + "self_attn.k_proj.weight"].T).reshape(t, nkv, hd)
        v = (x @ p[pre + "self_attn.v_proj.weight"].T).reshape(t, nkv, hd)
        qr, kr = _rope(q, pos, theta), _rope(k, pos, theta).repeat_interleave(nh // nkv, 1)
        att = torch.softmax(torch.einsum("thd,shd->hts", qr, kr) * hd**-0.5 + mask, -1)
        o = torch.einsum("hts,shd->thd", att, v.repeat_interleave(nh // nkv, 1)).reshape(t, nh * hd)
        h = h + o @ p[pre + "self_attn.o_proj.weight"].T
        x = _rms(h, p[pre + "post_attention_layernorm.weight"], eps)
        if i in layers:
            acts[f"x{i}"] = x
        g, u = x @ p[pre + "mlp.gate_proj.weight"].T, x @ p[pre + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(g) * u) @ p[pre + "mlp.down_proj.weight"].T
    return acts


def fit_head_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-dimension RMSNorm weight w minimising E||x/rms(x) * w - x||^2 over all tokens and heads.

    ``x`` is ``[T, heads, head_dim]`` (float64). Closed form per dimension d:
    ``w_d = sum(x_d^2 / r) / sum(x_d^2 / r^2)`` with ``r = sqrt(mean_d x^2 + eps)``.
    """
    r = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    num = (x.pow(2) / r).reshape(-1, x.shape[-1]).sum(0)
    den = (x.pow(2) / r.pow(2)).reshape(-1, x.shape[-1]).sum(0)
    return num / den


def linear_regime_norm(x: torch.Tensor, eps: float, delta: float) -> tuple[float, torch.Tensor]:
    """(power-of-two scale s for the projection, RMSNorm weight) making ``norm(s*x) ~= x``.

    With ``s^2 * mean(x^2) <= delta * eps`` for every calibration row, ``eps`` dominates the
    RMS, so ``RMSNorm(s*x) * sqrt(eps)/s = x / sqrt(1 + s^2*mean(x^2)/eps)``: x to within delta/2.
    """
    peak = float(x.pow(2).mean(-1).max())
    scale = 2.0 ** np.floor(np.log2(np.sqrt(delta * eps / max(peak, 1e-30))))
    return scale, torch.full((x.shape[-1],), np.sqrt(eps) / scale, dtype=torch.float64)


def make_router(x: torch.Tensor, num_experts: int, logit_std: float, rng: np.random.Generator) -> torch.Tensor:
    """Seeded router ``[E, H]`` over MLP inputs ``x`` ``[T, H]`` (float64).

    Rows are Gaussian, divided by each input dimension's std over the calibration tokens (so a
    few large-magnitude dimensions cannot dominate), made orthogonal to the mean input (so the
    shared component adds nothing and routes follow what differs between tokens), then scaled
    so the router logits on the calibration tokens have std ``logit_std``.
    """
    std = x.std(0).clamp_min(1e-6)
    g = torch.from_numpy(rng.standard_normal((num_experts, x.shape[1])))
    w = g / std
    mu = x.mean(0)
    mu = mu / mu.norm()
    w = w - (w @ mu)[:, None] * mu[None]
    logits = x @ w.T
    return w * (logit_std / logits.std())


def perturb(w: torch.Tensor, noise: float, rng: np.random.Generator) -> torch.Tensor:
    """``w * (1 + a*N1) + a*std(w)*N2`` with ``a = noise/sqrt(2)``: total noise ~ ``noise*std(w)``.

    Elementwise float32 arithmetic on numpy PCG64 normals (std in float64), so bytes are
    reproducible across machines.
    """
    a = np.float32(noise / np.sqrt(2.0))
    w32 = w.to(torch.float32).numpy()
    sd = np.float32(a * np.std(w32, dtype=np.float64))
    n1 = rng.standard_normal(w32.shape, dtype=np.float32)
    n2 = rng.standard_normal(w32.shape, dtype=np.float32)
    return torch.from_numpy(w32 * (np.float32(1.0) + a * n1) + sd * n2)


def moe_config(dense: dict[str, Any], layers: list[int], *, num_experts: int, top_k: int, every: int) -> dict:
    """Qwen3-MoE config dict carrying over every dense value."""
    n = dense["num_hidden_layers"]
    head_dim = dense.get("head_dim") or dense["hidden_size"] // dense["num_attention_heads"]
    rope = dense.get("rope_parameters") or {"rope_type": "default", "rope_theta": dense["rope_theta"]}
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps",
            "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range")
    cfg = {k: dense[k] for k in keep if k in dense}
    cfg.update(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=head_dim,
        attention_bias=False, attention_dropout=0.0, rope_theta=rope["rope_theta"], rope_parameters=rope,
        use_sliding_window=False, sliding_window=None, use_cache=True, dtype="float32",
        num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=True,
        moe_intermediate_size=dense["intermediate_size"], decoder_sparse_step=every,
        mlp_only_layers=[i for i in range(n) if i not in layers],
        output_router_logits=False, router_aux_loss_coef=0.001,
    )
    return cfg


def upcycled_state_dict(sd: dict[str, torch.Tensor], cfg: dict[str, Any], acts: dict[str, torch.Tensor],
                        layers: list[int], *, num_experts: int, noise: float, logit_std: float, seed: int,
                        qk_norm: str = "linear", delta: float = 1e-4) -> dict[str, torch.Tensor]:
    """Qwen3-MoE tensors (HF hub layout: per-expert ``mlp.experts.E.*_proj`` + ``mlp.gate``)."""
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    out: dict[str, torch.Tensor] = {}
    for name, w in sd.items():
        parts = name.split(".")
        if name.startswith("model.layers.") and int(parts[2]) in layers and parts[3] == "mlp":
            continue
        out[name] = w.to(torch.float32).contiguous()
    eps = cfg["rms_norm_eps"]
    for i in range(cfg["num_hidden_layers"]):
        for which in ("q", "k"):
            x = acts[f"{which}{i}"]
            if qk_norm == "linear":
                scale, w = linear_regime_norm(x, eps, delta)
                name = f"model.layers.{i}.self_attn.{which}_proj.weight"
                out[name] = (sd[name].to(torch.float64) * scale).to(torch.float32)
            elif qk_norm == "calibrated":
                w = fit_head_norm(x, eps)
            elif qk_norm == "identity":
                w = torch.ones(hd)
            else:
                raise ValueError(f"qk_norm must be 'linear', 'calibrated' or 'identity', got {qk_norm!r}")
            out[f"model.layers.{i}.self_attn.{which}_norm.weight"] = w.to(torch.float32)
    for i in layers:
        pre = f"model.layers.{i}.mlp."
        rng = np.random.default_rng([seed, i, 0])
        out[pre + "gate.weight"] = make_router(acts[f"x{i}"], num_experts, logit_std, rng).to(torch.float32)
        for e in range(num_experts):
            for j, proj in enumerate(("gate_proj", "up_proj", "down_proj")):
                rng = np.random.default_rng([seed, i, e + 1, j])
                w = perturb(sd[f"{pre}{proj}.weight"], noise, rng).to(torch.float32)
                out[f"{pre}experts.{e}.{proj}.weight"] = w.contiguous()
    return out


def upcycle(src_dir: Path, out_dir: Path, *, num_experts: int = 8, top_k: int = 2, every: int = 3,
            noise: float = 0.1, logit_std: float = 4.0, seed: int = 0, qk_norm: str = "linear",
            delta: float = 1e-4, on_step: Callable[[str], None] | None = None) -> dict:
    """Write a Qwen3-MoE checkpoint upcycled from the dense HF Llama in ``src_dir``; returns its config.

    Not atomic by itself (``registry.prepare`` builds into a temp dir and renames it).
    ``on_step`` is called with each of ``BUILD_STEPS`` as that step starts.
    """
    step = on_step or (lambda _: None)
    from safetensors.torch import load_file, save_file

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    dense = json.loads((src_dir / "config.json").read_text())
    if dense.get("model_type") != "llama":
        raise ValueError(f"upcycle expects a llama checkpoint, got {dense.get('model_type')!r}")
    rope_type = (dense.get("rope_parameters") or {}).get("rope_type", "default")
    if dense.get("attention_bias") or dense.get("mlp_bias") or dense.get("rope_scaling") or rope_type != "default":
        raise ValueError("upcycle supports plain-RoPE Llama checkpoints without biases only")
    step(BUILD_STEPS[0])
    sd = load_file(str(src_dir / "model.safetensors"))
    layers = moe_layer_indices(dense["num_hidden_layers"], every)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thread-count-independent fp64 stats; also faster on a loaded box
    step(BUILD_STEPS[1])
    try:
        acts = collect_activations(sd, dense, calibration_batches(src_dir, dense["vocab_size"], seed), layers)
    finally:
        torch.set_num_threads(threads)
    step(BUILD_STEPS[2])
    tensors = upcycled_state_dict(sd, dense, acts, layers, num_experts=num_experts, noise=noise,
                                  logit_std=logit_std, seed=seed, qk_norm=qk_norm, delta=delta)
    cfg = moe_config(dense, layers, num_experts=num_experts, top_k=top_k, every=every)
    cfg["execstate_upcycle"] = {"seed": seed, "noise": noise, "logit_std": logit_std, "qk_norm": qk_norm,
                                "delta": delta, "recipe_version": RECIPE_VERSION}
    out_dir.mkdir(parents=True, exist_ok=True)
    step(BUILD_STEPS[3])
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                 "special_tokens_map.json"):
        if (src_dir / name).is_file():
            shutil.copyfile(src_dir / name, out_dir / name)
    return cfg
