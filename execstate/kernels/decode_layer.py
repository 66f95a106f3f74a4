"""A whole decoder layer of a decode step in one C call (C: ``decode_layer``).

A decode step's layer is ~15 small calls on the per-op path (RMSNorm, q/k/v linear, split +
QK-norm + RoPE, K/V write, paged attention, output projection, residual, RMSNorm, MLP);
each costs microseconds of Python, which at batch 1 on a small model is a large share of
the step. ``LayerWeights`` checks a layer's weights once; ``DecodeTables`` checks a step's
block tables, slots and KV pool once; ``run_layer`` then makes one C call per layer, no
allocation, no further checks.

Numerics: the C entry runs the same kernels in the same order as the per-op kernel path
(``model/layers.py`` with ``use_kernels``), so its results are bitwise equal to it: per row,
deterministic and batch-invariant (tested in ``tests/kernels/test_decode_layer.py``). Each
matrix is multiplied by the row kernel of its format (``kernels/formats.py``: fp32, bf16 widened,
bf16 arithmetic, GGUF blocks), the same dot products as that format's per-op kernel; norms,
biases and activations are fp32 whatever the format.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from execstate.kernels.ext import is_f32_cpu, lib, require, sync_threads
from execstate.kernels.gemm import MAX_LINEAR_ROWS
from execstate.kernels.weight_format import WeightFormat

_MATRICES = ("w_qkv", "w_o", "w_router", "w_gate_up", "w_down")  # the order of LayerWeights.formats


class LayerWeights(NamedTuple):
    """One layer's weights as checked data pointers (0 = absent) and sizes; ``tensors`` keeps
    every tensor alive while the pointers are in use. Build with ``layer_weights``."""

    ptrs: tuple[int, ...]  # in_norm, w_qkv, b_qkv, q_norm, k_norm, w_o, b_o, post_norm, w_router, w_gu, w_d
    tensors: tuple[torch.Tensor, ...]
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int  # router rows (MoE layer), else 0
    intermediate: int  # dense MLP width, else 0
    eps: float
    bf16: bool  # the matrices are stored in bf16
    formats: tuple[WeightFormat, ...] = ()  # kernel format of w_qkv, w_o, w_router, w_gate_up, w_down


def _check(t: torch.Tensor | None, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> int:
    if t is None:
        return 0
    require(t, name, len(shape), dtype)
    if tuple(t.shape) != shape:
        raise ValueError(f"decode_layer: {name} must be {shape}, got {tuple(t.shape)}")
    return int(t.data_ptr())


def _check_matrix(t: torch.Tensor | None, name: str, rows: int, cols: int, fmt: WeightFormat) -> int:
    """A matrix ``[rows, cols]`` as stored in ``fmt`` (``ValueError`` naming it otherwise)."""
    if t is None:
        return 0
    shape, dtype = fmt.storage(rows, cols)
    return _check(t, name, shape, dtype)


def layer_weights(in_norm: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None,
                  q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, w_o: torch.Tensor,
                  b_o: torch.Tensor | None, post_norm: torch.Tensor, *, num_heads: int, num_kv_heads: int,
                  head_dim: int, eps: float, w_router: torch.Tensor | None = None,
                  w_gate_up: torch.Tensor | None = None, w_down: torch.Tensor | None = None,
                  formats: dict[str, WeightFormat] | None = None) -> LayerWeights:
    """Checked weights of one layer (``ValueError`` naming the first bad one). ``q_norm``/``k_norm``:
    per-head norm weights ``[head_dim]``, both or neither. Then either ``w_router [E, H]`` (the
    call returns router logits) or ``w_gate_up [2I, H]`` + ``w_down [H, I]`` (dense SwiGLU MLP,
    added to the residual) or none of them. Without ``formats`` the matrices (``w_*``) are all
    fp32 or all bf16 (widened: fp32 arithmetic), as ``w_qkv`` is; ``formats`` names the kernel
    format of any of them (``kernels/formats.py``: bf16 arithmetic, GGUF blocks) and each is
    checked against its format's storage. The norm weights and biases are fp32."""
    lib()
    wt = torch.bfloat16 if getattr(w_qkv, "dtype", None) is torch.bfloat16 else torch.float32
    default = WeightFormat.BF16 if wt is torch.bfloat16 else WeightFormat.F32
    fmt = tuple((formats or {}).get(name, default) for name in _MATRICES)
    h = in_norm.shape[0] if in_norm.dim() == 1 else -1
    qkv_n = (num_heads + 2 * num_kv_heads) * head_dim
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads or head_dim < 2 or head_dim % 2:
        raise ValueError(f"decode_layer: bad heads {num_heads}/{num_kv_heads} of {head_dim}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("decode_layer: give both q_norm and k_norm or neither")
    if w_router is not None and (w_gate_up is not None or w_down is not None):
        raise ValueError("decode_layer: a layer has a router or a dense MLP, not both")
    if (w_gate_up is None) != (w_down is None):
        raise ValueError("decode_layer: give both w_gate_up and w_down or neither")
    e = w_router.shape[0] if w_router is not None else 0
    i = w_gate_up.shape[0] // 2 if w_gate_up is not None else 0
    ptrs = (
        _check(in_norm, "in_norm", (h,)), _check_matrix(w_qkv, "w_qkv", qkv_n, h, fmt[0]),
        _check(b_qkv, "b_qkv", (qkv_n,)), _check(q_norm, "q_norm", (head_dim,)), _check(k_norm, "k_norm", (head_dim,)),
        _check_matrix(w_o, "w_o", h, num_heads * head_dim, fmt[1]), _check(b_o, "b_o", (h,)),
        _check(post_norm, "post_norm", (h,)), _check_matrix(w_router, "w_router", e, h, fmt[2]),
        _check_matrix(w_gate_up, "w_gate_up", 2 * i, h, fmt[3]), _check_matrix(w_down, "w_down", h, i, fmt[4]),
    )
    kept = tuple(t for t in (in_norm, w_qkv, b_qkv, q_norm, k_norm, w_o, b_o, post_norm, w_router, w_gate_up, w_down)
                 if t is not None)
    return LayerWeights(ptrs, kept, h, num_heads, num_kv_heads, head_dim, e, i, float(eps), wt is torch.bfloat16, fmt)


class DecodeTables:
    """A decode step's attention inputs, checked once and shared by every layer: token ``t``
    of the flat batch is sequence ``t``'s one new position, written at ``slots[t]`` of each
    layer's cache and attending to its first ``ctx_lens[t]`` positions through
    ``block_table[t]`` (``[T, max_blocks]`` int64, as ``PagedDecode`` builds it).
    ``k_cache``/``v_cache``: the pool's ``[num_layers, num_slots, n_kv_heads, head_dim]``."""

    def __init__(self, slots: torch.Tensor, tokens: torch.Tensor, block_table: torch.Tensor, ctx_lens: torch.Tensor,
                 block_size: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        t = slots.shape[0] if slots.dim() == 1 else -1
        for name, ten, shape in (("slots", slots, (t,)), ("tokens", tokens, (t,)), ("ctx_lens", ctx_lens, (t,)),
                                 ("block_table", block_table, (t, block_table.shape[-1]))):
            if ten.dtype != torch.int64 or not ten.is_cpu or not ten.is_contiguous() or tuple(ten.shape) != shape:
                raise ValueError(f"DecodeTables: {name} must be contiguous int64 CPU {shape}, got "
                                 f"{ten.dtype} {tuple(ten.shape)}")
        require(k_cache, "k_cache", 4)
        require(v_cache, "v_cache", 4)
        if k_cache.shape != v_cache.shape:
            raise ValueError(f"DecodeTables: k_cache {tuple(k_cache.shape)} != v_cache {tuple(v_cache.shape)}")
        num_slots = k_cache.shape[1]
        if block_size < 1 or block_table.shape[1] < 1:
            raise ValueError("DecodeTables: block_size and the block table width must be >= 1")
        if t > MAX_LINEAR_ROWS or t < 1:
            raise ValueError(f"DecodeTables: {t} tokens; the decode layer takes 1..{MAX_LINEAR_ROWS}")
        if not torch.equal(tokens, torch.arange(t)):
            raise ValueError("DecodeTables: token t must be sequence t's query (a decode-only step)")
        if int(slots.min()) < 0 or int(slots.max()) >= num_slots:
            raise ValueError(f"DecodeTables: a slot lies outside [0, {num_slots})")
        width = block_table.shape[1]
        if int(block_table.min()) < 0 or int(block_table.max()) * block_size >= num_slots:
            raise ValueError(f"DecodeTables: a block id lies outside the pool of {num_slots // block_size} blocks")
        if int(ctx_lens.min()) < 1 or int(ctx_lens.max()) > width * block_size:
            raise ValueError(f"DecodeTables: ctx_lens must be in [1, {width * block_size}]")
        self.num_tokens, self.block_size, self.width = t, block_size, width
        self.keep = (slots, tokens, block_table, ctx_lens, k_cache, v_cache)
        self.ptrs = (slots.data_ptr(), tokens.data_ptr(), block_table.data_ptr(), ctx_lens.data_ptr())
        self.k_base, self.v_base = k_cache.data_ptr(), v_cache.data_ptr()
        self.num_layers = k_cache.shape[0]
        self.layer_bytes = k_cache[0].numel() * k_cache.element_size()
        self.kv_shape = tuple(k_cache.shape[2:])


def check_step(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tables: DecodeTables) -> None:
    """``x [T, H]`` fp32 (updated in place by ``run_layer``) and ``cos``/``sin`` ``[T, head_dim]``."""
    require(x, "x", 2)
    require(cos, "cos", 2)
    require(sin, "sin", 2)
    t = tables.num_tokens
    if x.shape[0] != t or cos.shape != sin.shape or cos.shape[0] != t:
        raise ValueError(f"decode_layer: x {tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)} "
                         f"for {t} tokens")


def run_layer(layer: int, w: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              tables: DecodeTables, h_out: torch.Tensor | None = None, logits_out: torch.Tensor | None = None,
              timers: tuple[int, int, int] = (0, 0, 0)) -> None:
    """Layer ``layer`` of the step in place on ``x`` (checked by ``check_step`` for this step):
    attention block, residual, post-norm, then the dense MLP and its residual (``w`` has one)
    or the router logits into ``logits_out [T, E]`` (``w`` has a router; the post-norm
    output goes to ``h_out [T, H]``, which the caller's experts read). ``timers``: (pointer,
    threads, clock) of ``StepTimers.kernel_args()``, the accumulators each thread adds its phase
    times to and its clock (1: CPU time, 0: wall; ``model/step_timers.py``); ``(0, 0, 0)``: no timing."""
    t, hd = tables.num_tokens, w.head_dim
    if tuple(x.shape) != (t, w.hidden) or tuple(cos.shape) != (t, hd) or not 0 <= layer < tables.num_layers \
            or tables.kv_shape != (w.num_kv_heads, hd):
        raise ValueError(f"decode_layer: layer {layer}: x {tuple(x.shape)} / cos {tuple(cos.shape)} / KV "
                         f"{tables.kv_shape} do not fit its weights")
    h_ptr = logits_ptr = 0
    if w.num_experts:
        if h_out is None or logits_out is None or not (is_f32_cpu(h_out) and is_f32_cpu(logits_out)) \
                or tuple(h_out.shape) != (t, w.hidden) or tuple(logits_out.shape) != (t, w.num_experts):
            raise ValueError("decode_layer: a router layer needs h_out [T, H] and logits_out [T, E] (fp32, contiguous)")
        h_ptr, logits_ptr = h_out.data_ptr(), logits_out.data_ptr()
    elif h_out is not None:
        if not is_f32_cpu(h_out) or tuple(h_out.shape) != (t, w.hidden):
            raise ValueError("decode_layer: h_out must be fp32 contiguous [T, H]")
        h_ptr = h_out.data_ptr()
    p = w.ptrs
    off = layer * tables.layer_bytes
    slots, tok, bt, cl = tables.ptrs
    sync_threads()
    lib().decode_layer(x.data_ptr(), p[0], p[1], p[2], p[3], p[4], cos.data_ptr(), sin.data_ptr(),
                       tables.k_base + off, tables.v_base + off, slots, tok, bt, cl, p[5], p[6], p[7], h_ptr, p[8],
                       logits_ptr, p[9], p[10], t, w.hidden, w.num_heads, w.num_kv_heads, hd, tables.width,
                       tables.block_size, w.num_experts, w.intermediate, w.eps, hd**-0.5,
                       sum(int(f) << (4 * j) for j, f in enumerate(w.formats)), *timers)


__all__ = ["DecodeTables", "LayerWeights", "check_step", "layer_weights", "run_layer"]
