"""In-place weight updates (model/weight_copy.py): same values as a fresh load, no
reallocation, and a bad state dict changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execstate.model.loader import load_hf_state_dict, load_model
from execstate.model.random_models import ARCHITECTURES, make_random
from execstate.model.weight_copy import plan_weight_copy


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("wcopy")
    return make_random("qwen3_moe", root / "a", seed=0), make_random("qwen3_moe", root / "b", seed=1)


def _snapshot(model: torch.nn.Module) -> dict[str, tuple[int, torch.Tensor]]:
    return {n: (p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}


def _assert_unchanged(model: torch.nn.Module, snap: dict[str, tuple[int, torch.Tensor]]) -> None:
    for n, p in model.named_parameters():
        assert p.data_ptr() == snap[n][0], n
        assert torch.equal(p, snap[n][1]), n


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_update_equals_fresh_load_in_place(arch: str, tmp_path: Path) -> None:
    a, b = make_random(arch, tmp_path / "a", seed=0), make_random(arch, tmp_path / "b", seed=1)
    model, fresh = load_model(a), load_model(b)
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    plan = plan_weight_copy(model, load_hf_state_dict(b))
    assert plan.num_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    plan.apply()
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == ptrs  # nothing reallocated
    want = dict(fresh.named_parameters())
    for n, p in model.named_parameters():
        assert torch.equal(p, want[n]), n  # fused qkv / gate_up / stacked experts included
        assert not p.requires_grad


def test_fused_expert_layout_and_bf16_cast(pair: tuple[Path, Path]) -> None:
    a, b = pair
    sd = load_hf_state_dict(b)
    fused = {k: v for k, v in sd.items() if ".mlp.experts." not in k}
    for layer in (0, 2):  # the MoE layers: transformers 5.x in-memory layout [E, 2I, H] / [E, H, I]
        pre = f"model.layers.{layer}.mlp.experts."
        gate = torch.stack([sd[f"{pre}{e}.gate_proj.weight"] for e in range(8)])
        up = torch.stack([sd[f"{pre}{e}.up_proj.weight"] for e in range(8)])
        fused[pre + "gate_up_proj"] = torch.cat([gate, up], dim=1)
        fused[pre + "down_proj"] = torch.stack([sd[f"{pre}{e}.down_proj.weight"] for e in range(8)])
    model = load_model(a)
    plan_weight_copy(model, fused).apply()
    want = dict(load_model(b).named_parameters())
    assert all(torch.equal(p, want[n]) for n, p in model.named_parameters())
    bf16 = load_model(a, dtype=torch.bfloat16)
    plan_weight_copy(bf16, sd).apply()  # fp32 checkpoint into a bf16 model: cast, as at load
    want16 = dict(load_model(b, dtype=torch.bfloat16).named_parameters())
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, want16[n]) for n, p in bf16.named_parameters())


_CORRUPTIONS = ("drop", "extra", "shape", "int", "not_tensor", "meta", "scalar")


def _corrupt(sd: dict, name: str, how: str) -> str:
    """Break ``sd`` at ``name``; returns the text the error must contain."""
    t = sd[name]
    if how == "drop":
        del sd[name]
    elif how == "extra":
        sd[name + ".surplus"] = t.clone()
        return name + ".surplus"
    elif how == "shape":
        sd[name] = torch.zeros(t.shape[0] + 1, *t.shape[1:])
    elif how == "int":
        sd[name] = t.to(torch.int32)
    elif how == "not_tensor":
        sd[name] = t.tolist()
    elif how == "meta":
        sd[name] = torch.empty(t.shape, device="meta")
    else:
        sd[name] = torch.tensor(1.0)
    return name


class _Loaded:
    """A model on weights a (never changed: every update below fails) and b's state dict."""

    def __init__(self, pair: tuple[Path, Path]) -> None:
        self.model, self.state_dict = load_model(pair[0]), load_hf_state_dict(pair[1])

    def __repr__(self) -> str:  # hypothesis prints its arguments on failure
        return "<model a, state dict b>"


@pytest.fixture(scope="module")
def loaded(pair: tuple[Path, Path]) -> _Loaded:
    return _Loaded(pair)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_bad_tensor_is_named_and_nothing_changes(loaded: _Loaded, data: st.DataObject) -> None:
    model, sd = loaded.model, dict(loaded.state_dict)
    names = data.draw(st.lists(st.sampled_from(sorted(sd)), min_size=1, max_size=3, unique=True), label="tensors")
    hows = [data.draw(st.sampled_from(_CORRUPTIONS), label="how") for _ in names]
    named = {_corrupt(sd, n, how): how for n, how in zip(names, hows, strict=True)}
    snap = _snapshot(model)
    with pytest.raises(ValueError) as err:
        plan_weight_copy(model, sd)
    # Missing, unexpected and wrongly-typed tensors are always named; a shape is checked once
    # the parameter's other sources are present and typed (as at load), so a misshaped
    # tensor is named whenever only shapes are wrong.
    shapes_only = all(how in ("shape", "scalar") for how in hows)
    for name, how in named.items():
        if shapes_only or how not in ("shape", "scalar"):
            assert name in str(err.value)
    _assert_unchanged(model, snap)


def test_last_tensor_bad_still_copies_nothing(pair: tuple[Path, Path]) -> None:
    """Validation is complete before the first copy: a bad tensor late in the name order
    leaves the earlier (valid) ones uncopied."""
    a, b = pair
    model = load_model(a)
    sd = load_hf_state_dict(b)
    last = sorted(sd)[-1]
    sd[last] = sd[last][..., :-1]
    snap = _snapshot(model)
    with pytest.raises(ValueError, match=last.replace(".", r"\.")):
        plan_weight_copy(model, sd)
    _assert_unchanged(model, snap)


def test_tied_head_that_differs_is_refused(tmp_path: Path) -> None:
    path = make_random("llama", tmp_path / "llama", seed=0)
    model = load_model(path)
    sd = load_hf_state_dict(make_random("llama", tmp_path / "llama2", seed=1))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"] + 1
    snap = _snapshot(model)
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        plan_weight_copy(model, sd)
    _assert_unchanged(model, snap)
    with pytest.raises(ValueError, match="dict of tensors"):
        plan_weight_copy(model, [("model.norm.weight", torch.ones(64))])  # type: ignore[arg-type]
