"""Models served from GGUF blocks (model/gguf_model.py) and the quantiser of the builds
(model/gguf_quantize.py), on tiny random checkpoints.

Oracles: the GGUF file itself (every matrix of the model is the file's blocks byte for byte, q|k|v
and gate|up rows in order, experts stacked); the same model on the dequantised values in fp32
(``gguf.quants.dequantize``), which the GGUF kernels must match to fp32 rounding (they sum in
another fixed order); llama.cpp's naming and q/k row permutation (a ``llama`` file with permuted
rows loads to the same model); and the quantiser's rules (routers fp32, a group that shares a
kernel in one format).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from execstate.kernels import cpu
from execstate.kernels.gguf_blocks import dequantize
from execstate.kernels.weight_format import WeightFormat
from execstate.model.context import RouteCapture, StepContext
from execstate.model.gguf_model import GGUFEmbedding, load_gguf_model, model_formats, read_gguf
from execstate.model.gguf_quantize import plan_formats, quantize_checkpoint
from execstate.model.layers import Linear
from execstate.model.loader import load_model
from execstate.model.moe import SparseMoE
from execstate.model.random_models import make_random
from execstate.model.replay_attention import KernelCausalAttention
from execstate.model.weight_copy import plan_weight_copy

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
Q41, Q80, Q40 = WeightFormat.Q4_1, WeightFormat.Q8_0, WeightFormat.Q4_0


def quantized(tmp: Path, arch: str, fmt: WeightFormat, embedding: WeightFormat = Q80) -> tuple[Path, Path]:
    """(the fp32 checkpoint, its GGUF build)."""
    src = make_random(arch, tmp / f"{arch}-src", seed=1)
    quantize_checkpoint(src, tmp / f"{arch}-{fmt.name}", fmt, embedding)
    return src, tmp / f"{arch}-{fmt.name}"


@torch.no_grad()
def logits(model, ids: torch.Tensor, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    c = model.config
    mask = None if forced is None else torch.ones(len(ids), dtype=torch.bool)
    routes = RouteCapture(len(ids), c.num_moe_layers, c.top_k, forced, mask) if c.is_moe else None
    with StepContext(torch.arange(len(ids)), KernelCausalAttention(len(ids)), routes) as ctx:
        out = model.compute_logits(model(ids, ctx))
    return out, None if routes is None else routes.ids.clone()


@pytest.mark.parametrize(("arch", "fmt"), [("qwen3_moe", Q41), ("qwen2_moe", Q80), ("llama", Q40), ("mixtral", Q41)])
def test_matrices_are_the_files_blocks_and_compute_like_fp32(tmp_path: Path, arch: str, fmt: WeightFormat) -> None:
    src, out = quantized(tmp_path, arch, fmt)
    model = load_gguf_model(out, out / "model.gguf")
    model.use_cpu_kernels(True)
    assert model_formats(model) == {fmt, Q80}
    tensors, formats = read_gguf(out / "model.gguf", model.config)
    layer = model.layers[0]
    want_qkv = torch.cat([tensors[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert layer.attn.qkv_proj.weight_format is fmt and torch.equal(layer.attn.qkv_proj.weight, want_qkv)
    assert isinstance(model.embed_tokens, GGUFEmbedding) and torch.equal(
        model.embed_tokens.weight, tensors["model.embed_tokens.weight"])
    for m in model.modules():  # routers and shared-expert gates stay fp32, every norm fp32
        if isinstance(m, SparseMoE):
            assert m.weight_format is fmt and m.w_gate_up.dtype == torch.uint8
            assert m.router.weight_format is None and m.router.weight.dtype == torch.float32
            if m.shared_expert_gate is not None:
                assert m.shared_expert_gate.weight_format is None
    assert {p.dtype for n, p in model.named_parameters() if p.dim() == 1} == {torch.float32}
    # the same model on the dequantised values, in fp32: equal to fp32 rounding (another sum order)
    ref = load_model(src)
    params = dict(ref.named_parameters())
    modules = dict(model.named_modules())
    for name, p in model.named_parameters():
        if p.dtype == torch.uint8:
            owner = modules[name.rpartition(".")[0]]
            f = model.head_format if name == "lm_head.weight" else owner.weight_format
            params[name].copy_(dequantize(p, f).view(params[name].shape))
        else:
            params[name].copy_(p)
    ref.use_cpu_kernels(True)
    ids = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(0))
    got, routes = logits(model, ids)
    want, _ = logits(ref, ids, routes)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_llama_names_and_permuted_rows_load_to_the_same_model(tmp_path: Path) -> None:
    """A ``llama`` GGUF (llama.cpp's tensor names, q/k rows permuted) loads to the model the
    HF-named file gives: blocks moved by whole rows, no value changed."""
    import gguf

    from execstate.model.gguf_import import _GLOBAL_MAP, _LAYER_MAP

    _, out = quantized(tmp_path, "llama", Q41)
    cfg_model = load_gguf_model(out, out / "model.gguf")
    tensors, formats = read_gguf(out / "model.gguf", cfg_model.config)
    to_gguf = {v: k for k, v in _GLOBAL_MAP.items()}
    writer = gguf.GGUFWriter(str(tmp_path / "llama.gguf"), arch="llama")
    for name, t in sorted(tensors.items()):
        if name.endswith(".bias"):
            continue  # llama.cpp's llama has no q/k/v biases: drop them here and there
        if name in to_gguf:
            g = to_gguf[name]
        else:
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            g = f"blk.{i}.{next(k for k, v in _LAYER_MAP.items() if rest == v + '.weight')}.weight"
        data = t.numpy()
        part = g.split(".")[2] if g.startswith("blk.") else None
        heads = {"attn_q": cfg_model.config.num_heads, "attn_k": cfg_model.config.num_kv_heads}.get(part)
        if heads:
            data = _llama_cpp_permute(data, heads)
        f = formats.get(name)
        writer.add_tensor(g, np.ascontiguousarray(data), raw_dtype=None if f is None else getattr(
            gguf.GGMLQuantizationType, f.name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    mapped, _ = read_gguf(tmp_path / "llama.gguf", cfg_model.config)
    assert set(mapped) == {n for n in tensors if not n.endswith(".bias")}
    for name, t in mapped.items():
        assert torch.equal(t, tensors[name]), name


def test_plan_keeps_routers_fp32_and_a_kernel_group_in_one_format() -> None:
    rng = np.random.default_rng(0)
    state = {f"model.layers.0.mlp.experts.{e}.{p}_proj.weight": rng.standard_normal((64, 64)).astype(np.float32)
             for e in range(4) for p in ("gate", "up", "down")}
    state["model.layers.0.mlp.gate.weight"] = rng.standard_normal((4, 64)).astype(np.float32)
    state["model.embed_tokens.weight"] = rng.standard_normal((32, 64)).astype(np.float32)
    plan, errors, blocks = plan_formats(state, Q41, Q80)
    assert plan["model.layers.0.mlp.gate.weight"] is None and plan["model.embed_tokens.weight"] is Q80
    assert {plan[n] for n in state if ".experts." in n} == {Q41} and 0.05 < max(errors.values()) < 0.15
    state["model.layers.0.mlp.experts.2.down_proj.weight"] *= 2.0**-17  # fp16 scales go subnormal (upcycle.py's q/k)
    plan, errors, _ = plan_formats(state, Q80, Q80)
    assert errors["model.layers.0.mlp.experts.2.down_proj.weight"] > 0.02
    assert {plan[n] for n in state if ".experts." in n} == {None}  # the layer's experts: all fp32


def test_weight_updates_are_refused(tmp_path: Path) -> None:
    src, out = quantized(tmp_path, "qwen3_moe", Q41)
    model = load_gguf_model(out, out / "model.gguf")
    from execstate.model.loader import load_hf_state_dict

    with pytest.raises(ValueError, match="no weight updates"):
        plan_weight_copy(model, load_hf_state_dict(src))


def test_unsupported_block_type_is_refused(tmp_path: Path) -> None:
    import gguf

    _, out = quantized(tmp_path, "qwen3", Q41)
    tensors, formats = read_gguf(out / "model.gguf", load_gguf_model(out, out / "model.gguf").config)
    writer = gguf.GGUFWriter(str(tmp_path / "q5.gguf"), arch="execstate")
    for name, t in sorted(tensors.items()):
        if name == "model.layers.0.mlp.down_proj.weight":
            w = dequantize(t, formats[name]).numpy()
            writer.add_tensor(name, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q5_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q5_0)
        else:
            f = formats.get(name)
            writer.add_tensor(name, t.numpy(), raw_dtype=None if f is None else getattr(gguf.GGMLQuantizationType,
                                                                                          f.name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="Q5_0"):
        load_gguf_model(out, tmp_path / "q5.gguf")


def test_linear_modules_know_their_format(tmp_path: Path) -> None:
    _, out = quantized(tmp_path, "qwen3", Q80)
    model = load_gguf_model(out, out / "model.gguf")
    kinds = {m.weight_format for m in model.modules() if isinstance(m, Linear)}
    assert kinds == {Q80} and model.head_format is None or model.head_format is Q80
