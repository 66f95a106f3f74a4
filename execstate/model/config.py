"""Model configuration parsed from a Hugging Face ``config.json``.

``ModelConfig`` is the one description of a model's shape that the rest of the runtime
reads (layers, heads, experts, RoPE). It is parsed the way transformers 5.23 parses the
same file for each supported architecture: the same per-architecture defaults, the same
aliases (``num_experts`` / ``num_local_experts``), the same legacy RoPE keys
(``rope_theta`` + ``rope_scaling`` vs. ``rope_parameters``) and the same rule for which
decoder layers are MoE. Features the model layer does not implement (sliding-window
attention, dynamic/longrope RoPE, MLP biases, activations other than SiLU) are rejected
with a ``ValueError`` instead of being silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QWEN3_MOE = "Qwen3MoeForCausalLM"
QWEN2_MOE = "Qwen2MoeForCausalLM"
MIXTRAL = "MixtralForCausalLM"
OLMOE = "OlmoeForCausalLM"
LLAMA = "LlamaForCausalLM"
QWEN3 = "Qwen3ForCausalLM"

# Per-architecture defaults of transformers 5.23's config classes, for keys a config.json
# may omit. MoE keys are only read for MoE architectures.
_DEFAULTS: dict[str, dict[str, Any]] = {
    QWEN3_MOE: dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                    num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=32768,
                    rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, num_experts=128,
                    num_experts_per_tok=8, moe_intermediate_size=768),
    QWEN2_MOE: dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                    num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768,
                    rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, num_experts=60,
                    num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632),
    MIXTRAL: dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32,
                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, num_experts=8, num_experts_per_tok=2),
    OLMOE: dict(vocab_size=50304, hidden_size=2048, intermediate_size=2048, num_hidden_layers=16,
                num_attention_heads=16, num_key_value_heads=None, max_position_embeddings=4096,
                rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=50279, num_experts=64,
                num_experts_per_tok=8),
    LLAMA: dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=None, max_position_embeddings=2048,
                rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2),
    QWEN3: dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=32768,
                rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None),
}
_MODEL_TYPES = {"qwen3_moe": QWEN3_MOE, "qwen2_moe": QWEN2_MOE, "mixtral": MIXTRAL, "olmoe": OLMOE,
                "llama": LLAMA, "qwen3": QWEN3}
_MOE_ARCHS = (QWEN3_MOE, QWEN2_MOE, MIXTRAL, OLMOE)
# Which key wins when a config.json carries both spellings of the expert count; this is
# what transformers 5.23 resolves to (it depends on each class's attribute_map).
_EXPERT_KEYS = {
    QWEN3_MOE: ("num_local_experts", "num_experts"),
    QWEN2_MOE: ("num_experts",),
    MIXTRAL: ("num_experts", "num_local_experts"),
    OLMOE: ("num_local_experts", "num_experts"),
}
_SUPPORTED_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only (MoE) transformer. Immutable.

    Attention: q/k/v projections have a bias iff ``attention_bias``; the output projection
    has one iff ``attention_out_bias`` (they differ for Qwen2-MoE: q/k/v only). ``qk_norm``
    says q and k are RMS-normalised before RoPE; per head (Qwen3) or, for OLMoE
    (``qk_norm_per_head`` False), over the whole projection. ``clip_qkv`` (OLMoE) clamps
    q/k/v after the norm.

    RoPE: ``rope_theta`` is the base; ``rope_scaling`` is ``None`` for plain RoPE, else the
    standardized transformers parameter dict (``rope_type`` in linear | llama3 | yarn, plus
    its parameters; ``original_max_position_embeddings`` filled in as transformers does).
    Treat it as read-only.

    MoE: ``moe_layers`` are the decoder layer indices whose MLP is a sparse MoE block, in
    increasing order; MoE layer ``m`` (route records) is ``moe_layers[m]``. Other layers use
    a dense MLP of ``intermediate_size``. For dense models ``num_experts`` and ``top_k``
    are 0, ``moe_layers`` is empty and the MoE sizes are ``None``. ``norm_topk_prob``
    says the top-k probabilities are renormalised to sum to 1 (always True for Mixtral).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None = field(hash=False)
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    attention_out_bias: bool
    qk_norm: bool
    qk_norm_per_head: bool
    clip_qkv: float | None
    hidden_act: str
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int | None = None
    moe_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def is_moe(self) -> bool:
        return self.num_moe_layers > 0

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelConfig:
        """Parse ``<path>/config.json``."""
        file = Path(path) / "config.json"
        if not file.is_file():
            raise ValueError(f"no config.json in {path}")
        with file.open() as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Parse a config.json dict. Unknown architecture or unsupported feature: ValueError.

        The architecture is ``architectures[0]`` (exactly one entry), or, when the list is
        absent, the one ``AutoModelForCausalLM`` picks for ``model_type``.
        """
        archs = d.get("architectures") or []
        if not archs and d.get("model_type") in _MODEL_TYPES:  # AutoModelForCausalLM's choice
            archs = [_MODEL_TYPES[d["model_type"]]]
        if len(archs) != 1:
            raise ValueError(f"config.json must name exactly one architecture, got {archs!r} "
                             f"(model_type={d.get('model_type')!r})")
        arch = archs[0]
        if arch not in _DEFAULTS:
            raise ValueError(f"unsupported architecture {arch!r} (supported: {', '.join(_DEFAULTS)})")
        defaults = _DEFAULTS[arch]

        def get(key: str, default: Any = None) -> Any:
            return d[key] if key in d else defaults.get(key, default)

        hidden = int(get("hidden_size"))
        heads = int(get("num_attention_heads"))
        kv_heads = get("num_key_value_heads")
        head_dim = d.get("head_dim")
        if head_dim is None:  # Qwen3 (dense) defaults to 128, the others to hidden // heads
            head_dim = 128 if arch == QWEN3 else hidden // heads
        _reject_unsupported(arch, d)
        rope_theta, rope_scaling = _parse_rope(arch, d, int(get("max_position_embeddings")))
        if arch == QWEN2_MOE:
            attn_bias, out_bias = bool(d.get("qkv_bias", True)), False
        elif arch == MIXTRAL:
            attn_bias = out_bias = False
        else:
            attn_bias = out_bias = bool(d.get("attention_bias", False))
        eos = get("eos_token_id")
        eos_ids = () if eos is None else (int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos)
        bos = get("bos_token_id")
        clip = d.get("clip_qkv") if arch == OLMOE else None
        fields: dict[str, Any] = dict(
            architecture=arch, vocab_size=int(get("vocab_size")), hidden_size=hidden,
            num_layers=int(get("num_hidden_layers")), num_heads=heads,
            num_kv_heads=int(kv_heads) if kv_heads is not None else heads, head_dim=int(head_dim),
            intermediate_size=int(get("intermediate_size")), rms_norm_eps=float(get("rms_norm_eps")),
            rope_theta=rope_theta, rope_scaling=rope_scaling,
            max_position_embeddings=int(get("max_position_embeddings")),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attn_bias, attention_out_bias=out_bias,
            qk_norm=arch in (QWEN3_MOE, QWEN3, OLMOE), qk_norm_per_head=arch != OLMOE,
            clip_qkv=None if clip is None else float(clip), hidden_act=str(d.get("hidden_act", "silu")),
            eos_token_ids=eos_ids, bos_token_id=None if bos is None else int(bos),
        )
        if arch in _MOE_ARCHS:
            fields.update(_parse_moe(arch, d, defaults, fields["num_layers"], fields["intermediate_size"]))
        return cls(**fields)


def _parse_moe(arch: str, d: dict[str, Any], defaults: dict[str, Any], n_layers: int,
               intermediate: int) -> dict[str, Any]:
    num_experts = next((d[k] for k in _EXPERT_KEYS[arch] if k in d), defaults["num_experts"])
    num_experts = int(num_experts)
    top_k = int(d.get("num_experts_per_tok", defaults["num_experts_per_tok"]))
    if arch in (QWEN3_MOE, QWEN2_MOE):
        step = int(d.get("decoder_sparse_step", 1))
        if step < 1:
            raise ValueError(f"decoder_sparse_step must be >= 1, got {step}")
        mlp_only = set(d.get("mlp_only_layers") or [])
        moe_layers = tuple(i for i in range(n_layers)
                           if i not in mlp_only and num_experts > 0 and (i + 1) % step == 0)
        moe_inter = int(d.get("moe_intermediate_size", defaults["moe_intermediate_size"]))
    else:  # Mixtral, OLMoE: every layer is MoE, experts are intermediate_size wide
        moe_layers = tuple(range(n_layers))
        moe_inter = intermediate
    shared = None
    if arch == QWEN2_MOE:
        shared = int(d.get("shared_expert_intermediate_size", defaults["shared_expert_intermediate_size"]))
    if not moe_layers:
        return dict(num_experts=0, top_k=0, moe_layers=())
    return dict(num_experts=num_experts, top_k=top_k, moe_intermediate_size=moe_inter,
                norm_topk_prob=True if arch == MIXTRAL else bool(d.get("norm_topk_prob", False)),
                shared_expert_intermediate_size=shared, moe_layers=moe_layers)


def _reject_unsupported(arch: str, d: dict[str, Any]) -> None:
    if d.get("use_sliding_window") or (arch in (MIXTRAL, OLMOE) and d.get("sliding_window") is not None):
        raise ValueError(f"{arch}: sliding-window attention is not supported")
    if "sliding_attention" in (d.get("layer_types") or []):
        raise ValueError(f"{arch}: sliding-window attention layers are not supported")
    if arch == LLAMA and d.get("mlp_bias"):
        raise ValueError(f"{arch}: mlp_bias=True is not supported")
    if d.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise ValueError(f"{arch}: partial_rotary_factor={d['partial_rotary_factor']} is not supported")


def _parse_rope(arch: str, d: dict[str, Any], max_pos: int) -> tuple[float, dict[str, Any] | None]:
    """Mirror ``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`` + ``standardize_rope_params``.

    ``rope_scaling`` (legacy key) wins over ``rope_parameters``; a top-level ``rope_theta``
    fills in a missing ``rope_theta``; ``type`` is the legacy spelling of ``rope_type``.
    """
    params = dict(d.get("rope_scaling") or d.get("rope_parameters") or {})
    default_theta = 1_000_000.0 if arch == MIXTRAL else 10_000.0
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{arch}: per-layer-type rope_parameters are not supported: {params!r}")
    params.setdefault("rope_theta", d.get("rope_theta", default_theta))
    params.setdefault("rope_type", params.get("type", "default"))
    params.pop("type", None)
    rope_type = params["rope_type"]
    if rope_type not in _SUPPORTED_ROPE:
        raise ValueError(f"{arch}: rope_type {rope_type!r} is not supported (supported: {_SUPPORTED_ROPE})")
    if rope_type in ("llama3", "yarn"):
        params.setdefault("original_max_position_embeddings", max_pos)
    theta = params.pop("rope_theta")
    if theta is None:
        raise ValueError(f"{arch}: rope_theta is null")
    if params.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise ValueError(f"{arch}: partial_rotary_factor is not supported")
    required = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}
    missing = [k for k in required.get(rope_type, ()) if params.get(k) is None]
    if missing:
        raise ValueError(f"{arch}: rope_type {rope_type!r} needs {missing}")
    return float(theta), (None if rope_type == "default" else params)


def _validate(c: ModelConfig) -> None:
    positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "max_position_embeddings")
    bad = [f"{k}={getattr(c, k)}" for k in positive if getattr(c, k) <= 0]
    if bad:
        raise ValueError(f"{c.architecture}: fields must be positive: {', '.join(bad)}")
    if c.num_heads % c.num_kv_heads:
        raise ValueError(f"{c.architecture}: num_heads={c.num_heads} not a multiple of "
                         f"num_kv_heads={c.num_kv_heads}")
    if c.head_dim % 2:
        raise ValueError(f"{c.architecture}: head_dim={c.head_dim} must be even for RoPE")
    if c.hidden_act != "silu":
        raise ValueError(f"{c.architecture}: hidden_act={c.hidden_act!r} is not supported (only 'silu')")
    if not c.qk_norm_per_head and c.qk_norm and c.head_dim * c.num_heads != c.hidden_size:
        raise ValueError(f"{c.architecture}: OLMoE needs head_dim * num_heads == hidden_size")
    if c.moe_layers:
        layers = list(c.moe_layers)
        if layers != sorted(set(layers)) or not 0 <= layers[0] <= layers[-1] < c.num_layers:
            raise ValueError(f"{c.architecture}: invalid moe_layers {c.moe_layers}")
        if not 1 <= c.top_k <= c.num_experts:
            raise ValueError(f"{c.architecture}: need 1 <= top_k={c.top_k} <= num_experts={c.num_experts}")
        if c.num_experts > 32767:
            raise ValueError(f"{c.architecture}: num_experts={c.num_experts} does not fit int16 routes")
        if not c.moe_intermediate_size or c.moe_intermediate_size <= 0:
            raise ValueError(f"{c.architecture}: moe_intermediate_size must be positive")
    elif c.num_experts or c.top_k:
        raise ValueError(f"{c.architecture}: num_experts/top_k set but no MoE layers")
    if len(c.moe_layers) < c.num_layers and c.intermediate_size <= 0:
        raise ValueError(f"{c.architecture}: intermediate_size must be positive for dense layers")
