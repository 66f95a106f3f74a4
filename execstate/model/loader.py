"""Loading HF-format checkpoints (safetensors) into ``CausalLM``.

Name mapping, HF checkpoint -> ours (``L`` = ``model.layers.{i}.``, ``l`` = ``layers.{i}.``):

- ``model.embed_tokens.weight`` -> ``embed_tokens.weight``; ``model.norm.weight`` ->
  ``norm.weight``; ``lm_head.weight`` -> ``lm_head.weight`` (tied models have no lm_head:
  the embedding is used; an ``lm_head.weight`` in the file must then equal the embedding,
  else ``ValueError``, where transformers would silently untie).
- ``L input_layernorm`` / ``L post_attention_layernorm`` -> ``l input_norm`` / ``l post_attn_norm``.
- ``L self_attn.{q,k,v}_proj.{weight,bias}`` -> ``l attn.qkv_proj.*`` (concatenated q|k|v);
  ``o_proj``, ``q_norm``, ``k_norm`` -> ``l attn.*``.
- Dense MLP: ``L mlp.{gate,up}_proj.weight`` -> ``l mlp.gate_up_proj.weight`` (gate|up),
  ``L mlp.down_proj.weight`` -> ``l mlp.down_proj.weight``.
- MoE router ``L mlp.gate.weight`` -> ``l mlp.router.weight``; experts, either format:
  - fused (transformers 5.x in-memory / ``state_dict()`` layout):
    ``L mlp.experts.gate_up_proj [E, 2I, H]`` and ``L mlp.experts.down_proj [E, H, I]``;
  - per expert (what transformers 5.23's ``save_pretrained`` writes, and every hub
    checkpoint): ``L mlp.experts.{e}.{gate,up,down}_proj.weight``, stacked on load.
  Mixtral uses ``block_sparse_moe.`` for ``mlp.`` and ``w1``/``w3``/``w2`` for
  gate/up/down (both prefixes are accepted, as transformers renames one to the other).
- Qwen2-MoE: ``L mlp.shared_expert.*`` -> ``l mlp.shared_expert.*`` (gate|up fused),
  ``L mlp.shared_expert_gate.weight`` -> ``l mlp.shared_expert_gate.weight``.

``*.rotary_emb.inv_freq`` (old checkpoints) is ignored. Anything else that is missing,
unexpected or wrongly shaped raises one ``ValueError`` naming every offending tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from execstate.model.checkpoint_files import load_hf_state_dict, report
from execstate.model.config import MIXTRAL, ModelConfig
from execstate.model.transformer import CausalLM
from execstate.state.huge_pages import empty_huge

Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class Source:
    """One way to build a parameter: these checkpoint tensors, combined by ``combine``.

    ``views(param, parts)`` gives, for each part, the region of an existing parameter it
    fills (what ``combine`` would put there), so a weight update can copy in place; it
    raises ``RuntimeError``/``IndexError`` when the parts cannot tile the parameter.
    """

    names: tuple[str, ...]
    combine: Callable[[Tensors], torch.Tensor]
    views: Callable[[torch.Tensor, Tensors], Tensors]


def _one(name: str) -> Source:
    return Source((name,), lambda ts: ts[0], lambda p, ts: [p])


def _cat(*names: str) -> Source:
    return Source(names, lambda ts: torch.cat(ts, dim=0),
                  lambda p, ts: list(p.split([t.shape[0] for t in ts], dim=0)))


def _stack(names: list[str]) -> Source:
    return Source(tuple(names), lambda ts: torch.stack(ts, dim=0), lambda p, ts: list(p.unbind(0)))


def _stack_pairs(gates: list[str], ups: list[str]) -> Source:
    e = len(gates)
    def combine(ts: Tensors) -> torch.Tensor:  # [E, I, H] gates | [E, I, H] ups -> [E, 2I, H]
        return torch.cat([torch.stack(ts[:e]), torch.stack(ts[e:])], dim=1)

    def views(p: torch.Tensor, ts: Tensors) -> Tensors:
        half = p.shape[1] // 2
        return [p[i, :half] for i in range(p.shape[0])] + [p[i, half:] for i in range(p.shape[0])]

    return Source(tuple(gates + ups), combine, views)


def _recipes(config: ModelConfig) -> dict[str, list[Source]]:
    """Our parameter name -> alternative sources, the first complete one is used."""
    r: dict[str, list[Source]] = {
        "embed_tokens.weight": [_one("model.embed_tokens.weight")],
        "norm.weight": [_one("model.norm.weight")],
    }
    if not config.tie_word_embeddings:
        r["lm_head.weight"] = [_one("lm_head.weight")]
    for i in range(config.num_layers):
        hf, our = f"model.layers.{i}.", f"layers.{i}."
        att = hf + "self_attn."
        r[our + "input_norm.weight"] = [_one(hf + "input_layernorm.weight")]
        r[our + "post_attn_norm.weight"] = [_one(hf + "post_attention_layernorm.weight")]
        r[our + "attn.qkv_proj.weight"] = [_cat(*(f"{att}{p}_proj.weight" for p in "qkv"))]
        if config.attention_bias:
            r[our + "attn.qkv_proj.bias"] = [_cat(*(f"{att}{p}_proj.bias" for p in "qkv"))]
        r[our + "attn.o_proj.weight"] = [_one(att + "o_proj.weight")]
        if config.attention_out_bias:
            r[our + "attn.o_proj.bias"] = [_one(att + "o_proj.bias")]
        if config.qk_norm:
            r[our + "attn.q_norm.weight"] = [_one(att + "q_norm.weight")]
            r[our + "attn.k_norm.weight"] = [_one(att + "k_norm.weight")]
        if i in config.moe_layers:
            r.update(_moe_recipes(config, hf, our + "mlp."))
        else:
            mlp = hf + "mlp."
            r[our + "mlp.gate_up_proj.weight"] = [_cat(mlp + "gate_proj.weight", mlp + "up_proj.weight")]
            r[our + "mlp.down_proj.weight"] = [_one(hf + "mlp.down_proj.weight")]
    return r


def _moe_recipes(config: ModelConfig, hf: str, our: str) -> dict[str, list[Source]]:
    experts = range(config.num_experts)
    prefixes: tuple[str, ...]
    if config.architecture == MIXTRAL:
        prefixes, (g, u, d) = (hf + "block_sparse_moe.", hf + "mlp."), ("w1", "w3", "w2")
    else:
        prefixes, (g, u, d) = (hf + "mlp.",), ("gate_proj", "up_proj", "down_proj")
    r: dict[str, list[Source]] = {
        our + "router.weight": [_one(p + "gate.weight") for p in prefixes],
        our + "w_gate_up": [_one(p + "experts.gate_up_proj") for p in prefixes]
        + [_stack_pairs([f"{p}experts.{e}.{g}.weight" for e in experts],
                        [f"{p}experts.{e}.{u}.weight" for e in experts]) for p in prefixes],
        our + "w_down": [_one(p + "experts.down_proj") for p in prefixes]
        + [_stack([f"{p}experts.{e}.{d}.weight" for e in experts]) for p in prefixes],
    }
    if config.shared_expert_intermediate_size is not None:
        s = hf + "mlp.shared_expert."
        r[our + "shared_expert.gate_up_proj.weight"] = [_cat(s + "gate_proj.weight", s + "up_proj.weight")]
        r[our + "shared_expert.down_proj.weight"] = [_one(s + "down_proj.weight")]
        r[our + "shared_expert_gate.weight"] = [_one(hf + "mlp.shared_expert_gate.weight")]
    return r


def _ignored(name: str, config: ModelConfig) -> bool:
    return name.endswith("rotary_emb.inv_freq") or (config.tie_word_embeddings and name == "lm_head.weight")


def _check_tied_head(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> None:
    """A tied model's file may repeat the head; if it differs, transformers unties silently. We refuse."""
    head, embed = state_dict.get("lm_head.weight"), state_dict.get("model.embed_tokens.weight")
    if (config.tie_word_embeddings and isinstance(head, torch.Tensor) and isinstance(embed, torch.Tensor)
            and not torch.equal(head, embed)):
        raise ValueError("tie_word_embeddings=True but lm_head.weight differs from "
                         "model.embed_tokens.weight; set tie_word_embeddings=False in config.json "
                         "to use a separate head")


def match_checkpoint(
    model: CausalLM, state_dict: dict[str, torch.Tensor]
) -> tuple[dict[str, tuple[Source, Tensors]], list[str], list[str]]:
    """For each parameter of ``model``, the first complete source in ``state_dict`` and its
    tensors; plus the missing and the unexpected checkpoint names (both empty when the
    checkpoint matches). No side effects. Raises ``ValueError`` for a tied head that
    differs from the embedding."""
    config = model.config
    _check_tied_head(state_dict, config)
    params = dict(model.named_parameters(remove_duplicate=False))
    recipes = _recipes(config)
    if set(recipes) != set(params):  # programming error, not a checkpoint problem
        raise RuntimeError(f"loader recipes out of sync with the model: {sorted(set(recipes) ^ set(params))}")
    missing: list[str] = []
    consumed: set[str] = set()
    matches: dict[str, tuple[Source, Tensors]] = {}
    for target, alternatives in recipes.items():
        src = next((a for a in alternatives if all(n in state_dict for n in a.names)), None)
        if src is None:  # report against the alternative the checkpoint most looks like
            best = max(alternatives, key=lambda a: (sum(n in state_dict for n in a.names), -len(a.names)))
            missing += [n for n in best.names if n not in state_dict]
            consumed.update(n for n in best.names if n in state_dict)
            continue
        consumed.update(src.names)
        matches[target] = (src, [state_dict[n] for n in src.names])
    unexpected = sorted(n for n in state_dict if n not in consumed and not _ignored(n, config))
    return matches, missing, unexpected


def checkpoint_error(config: ModelConfig, problems: list[tuple[str, list[str]]]) -> ValueError | None:
    """One ``ValueError`` naming every offending tensor, or ``None`` when ``problems`` are all empty."""
    errors = [report(kind, names) for kind, names in problems if names]
    return ValueError(f"checkpoint does not match {config.architecture}: " + "; ".join(errors)) if errors else None


def load_hf_weights(model: CausalLM, state_dict: dict[str, torch.Tensor], *,
                    dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
    """Replace every parameter of ``model`` with tensors built from an HF-named ``state_dict``.

    ``dtype``/``device`` default to those of the model's current parameters (``cpu`` for
    a model on ``meta``). The model may live on ``meta``: parameters are replaced, not
    copied into; each is a fresh, contiguous, allocator-aligned tensor (numerics then do
    not depend on how the checkpoint was laid out). Validation is complete before
    anything is assigned; on ``ValueError`` (missing / unexpected / wrongly-shaped
    tensors, all named) the model is unchanged. (A weight update of a loaded model copies
    in place instead: ``execstate.model.weight_copy``.)
    """
    matches, missing, unexpected = match_checkpoint(model, state_dict)
    params = dict(model.named_parameters(remove_duplicate=False))
    first = next(iter(params.values()))
    dtype = dtype or first.dtype
    device = torch.device(device) if device is not None else first.device
    if device.type == "meta":
        device = torch.device("cpu")

    bad_shape: list[str] = []
    built: dict[str, torch.Tensor] = {}
    for target, (src, parts) in matches.items():
        try:
            tensor = src.combine(parts)
        except RuntimeError as err:
            bad_shape.append(f"{'+'.join(src.names[:3])}{'...' if len(src.names) > 3 else ''} ({err})")
            continue
        want = tuple(params[target].shape)
        if tuple(tensor.shape) != want:
            bad_shape.append(f"{target} from {src.names[0]}{'...' if len(src.names) > 1 else ''}: "
                             f"got {tuple(tensor.shape)}, expected {want}")
            continue
        built[target] = tensor
    error = checkpoint_error(model.config, [("missing tensors", missing), ("unexpected tensors", unexpected),
                                            ("wrongly-shaped tensors", bad_shape)])
    if error is not None:
        raise error

    modules = dict(model.named_modules())
    for target, tensor in built.items():
        module_name, _, attr = target.rpartition(".")
        # Always a fresh allocation, never a view into the file's buffer: CPU GEMMs round
        # differently depending on pointer alignment, and replay must be bitwise across loads.
        # GGUF blocks (uint8, model/gguf_model.py) keep their bytes; floating tensors take dtype.
        # Large tensors land 2 MiB-aligned on huge pages (state/huge_pages.py): same bytes, and the
        # same alignment in every load, so two loads of one file run a step at the same speed.
        kind = dtype if tensor.is_floating_point() else tensor.dtype
        value = empty_huge(tensor.shape, kind, device).copy_(tensor)
        setattr(modules[module_name], attr, nn.Parameter(value, requires_grad=False))
    model.drop_decode_weights()


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> CausalLM:
    """Build a ``CausalLM`` from an HF directory (config.json + safetensors), in eval mode.

    The model is constructed on the ``meta`` device and its parameters are replaced by the
    checkpoint's tensors, so no memory is spent on a random initialisation.
    """
    config = ModelConfig.from_hf_dir(path)
    with torch.device("meta"):
        model = CausalLM(config)
    load_hf_weights(model, load_hf_state_dict(path), dtype=dtype, device=device)
    model.rotary.to(device)
    return model.eval()
