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

import numpy as np
import torch

from execstate.kernels.ext import lib, require, sync_threads
from execstate.kernels.gemm import MAX_LINEAR_ROWS
from execstate.kernels.weight_format import WeightFormat

_MATRICES = ("w_qkv", "w_o", "w_router", "w_gate_up", "w_down")  # the order of LayerWeights.formats


class LayerWeights(NamedTuple):
    """One layer's weights as checked data pointers (0 = absent) and sizes, packed once for C
    (``spec``); ``tensors`` keeps every tensor alive while the pointers are in use. Build with
    ``layer_weights``."""

    ptrs: tuple[int, ...]  # in_norm, w_qkv, b_qkv, q_norm, k_norm, w_o, b_o, post_norm, w_router, w_gu, w_d
    tensors: tuple[torch.Tensor, ...]
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int  # router rows (MoE layer), else 0
    intermediate: int  # dense MLP or expert width, else 0
    eps: float
    bf16: bool  # the matrices are stored in bf16
    formats: tuple[WeightFormat, ...] = ()  # kernel format of w_qkv, w_o, w_router, w_gate_up, w_down
    top_k: int = 0  # experts per token when the call runs the experts (0: the caller routes)
    spec: object = None  # the C side's packed copy (``layer_spec``)


def _check(t: torch.Tensor | None, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> int:
    if t is None:
        return 0
    require(t, name, len(shape), dtype)
    if tuple(t.shape) != shape:
        raise ValueError(f"decode_layer: {name} must be {shape}, got {tuple(t.shape)}")
    return int(t.data_ptr())


def _check_matrix(t: torch.Tensor | None, name: str, rows: int, cols: int, fmt: WeightFormat,
                  experts: int = 0) -> int:
    """A matrix ``[rows, cols]`` (``[experts, rows, cols]`` when ``experts``) as stored in ``fmt``
    (``ValueError`` naming it otherwise)."""
    if t is None:
        return 0
    shape, dtype = fmt.storage(rows, cols)
    return _check(t, name, (experts, *shape) if experts else shape, dtype)


def layer_weights(in_norm: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None,
                  q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, w_o: torch.Tensor,
                  b_o: torch.Tensor | None, post_norm: torch.Tensor, *, num_heads: int, num_kv_heads: int,
                  head_dim: int, eps: float, w_router: torch.Tensor | None = None,
                  w_gate_up: torch.Tensor | None = None, w_down: torch.Tensor | None = None,
                  formats: dict[str, WeightFormat] | None = None, top_k: int = 0,
                  norm_topk: bool = False) -> LayerWeights:
    """Checked weights of one layer (``ValueError`` naming the first bad one). ``q_norm``/``k_norm``:
    per-head norm weights ``[head_dim]``, both or neither. Then one of: ``w_gate_up [2I, H]`` +
    ``w_down [H, I]`` (dense SwiGLU MLP, added to the residual); ``w_router [E, H]`` alone (the
    call returns router logits); ``w_router`` with ``top_k`` >= 1 and the experts ``w_gate_up
    [E, 2I, H]`` + ``w_down [E, H, I]`` (the call routes, ``norm_topk``: the top-k weights
    renormalised, and adds the experts' weighted sum: ``kernels/csrc/decode_moe.c``); or none.
    Without ``formats`` the matrices (``w_*``) are all fp32 or all bf16 (widened: fp32
    arithmetic), as ``w_qkv`` is; ``formats`` names the kernel format of any of them
    (``kernels/formats.py``: bf16 arithmetic, GGUF blocks) and each is checked against its
    format's storage. The norm weights and biases are fp32."""
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
    if (w_gate_up is None) != (w_down is None):
        raise ValueError("decode_layer: give both w_gate_up and w_down or neither")
    if w_router is not None and w_gate_up is not None and not top_k:
        raise ValueError("decode_layer: a layer has a router or a dense MLP, not both (experts need top_k)")
    e = w_router.shape[0] if w_router is not None else 0
    experts = e if top_k else 0
    if top_k and (w_gate_up is None or not 1 <= top_k <= e):
        raise ValueError(f"decode_layer: top_k {top_k} needs a router and experts, 1 <= top_k <= {e}")
    i = w_gate_up.shape[1 if experts else 0] // 2 if w_gate_up is not None else 0
    ptrs = (
        _check(in_norm, "in_norm", (h,)), _check_matrix(w_qkv, "w_qkv", qkv_n, h, fmt[0]),
        _check(b_qkv, "b_qkv", (qkv_n,)), _check(q_norm, "q_norm", (head_dim,)), _check(k_norm, "k_norm", (head_dim,)),
        _check_matrix(w_o, "w_o", h, num_heads * head_dim, fmt[1]), _check(b_o, "b_o", (h,)),
        _check(post_norm, "post_norm", (h,)), _check_matrix(w_router, "w_router", e, h, fmt[2]),
        _check_matrix(w_gate_up, "w_gate_up", 2 * i, h, fmt[3], experts),
        _check_matrix(w_down, "w_down", h, i, fmt[4], experts),
    )
    kept = tuple(t for t in (in_norm, w_qkv, b_qkv, q_norm, k_norm, w_o, b_o, post_norm, w_router, w_gate_up, w_down)
                 if t is not None)
    spec = lib().layer_spec(*ptrs, h, num_heads, num_kv_heads, head_dim, e, i, top_k, float(eps), head_dim**-0.5,
                            sum(int(f) << (4 * j) for j, f in enumerate(fmt)), int(norm_topk))
    return LayerWeights(ptrs, kept, h, num_heads, num_kv_heads, head_dim, e, i, float(eps), wt is torch.bfloat16, fmt,
                        top_k, spec)


class DecodeTables:
    """A decode step's attention inputs, checked once and shared by every layer: token ``t``
    of the flat batch is sequence ``t``'s one new position, written at ``slots[t]`` of each
    layer's cache and attending to its first ``ctx_lens[t]`` positions through
    ``block_table[t]`` (``[T, max_blocks]`` int64, as ``PagedDecode`` builds it).
    ``k_cache``/``v_cache``: the pool's ``[num_layers, num_slots, n_kv_heads, head_dim]``, fp32 or
    bf16 (``kv_dtype``: the kernel writes each new K/V row rounded to nearest even and reads the
    rows widened, so attention's arithmetic stays fp32; at most 16 query heads per KV head)."""

    def __init__(self, slots: torch.Tensor, tokens: torch.Tensor, block_table: torch.Tensor, ctx_lens: torch.Tensor,
                 block_size: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        t = slots.shape[0] if slots.dim() == 1 else -1
        for name, ten, shape in (("slots", slots, (t,)), ("tokens", tokens, (t,)), ("ctx_lens", ctx_lens, (t,)),
                                 ("block_table", block_table, (t, block_table.shape[-1]))):
            if ten.dtype != torch.int64 or not ten.is_cpu or not ten.is_contiguous() or tuple(ten.shape) != shape:
                raise ValueError(f"DecodeTables: {name} must be contiguous int64 CPU {shape}, got "
                                 f"{ten.dtype} {tuple(ten.shape)}")
        kv_dtype = k_cache.dtype if k_cache.dtype in (torch.float32, torch.bfloat16) else torch.float32
        require(k_cache, "k_cache", 4, kv_dtype)
        require(v_cache, "v_cache", 4, kv_dtype)
        if k_cache.shape != v_cache.shape:
            raise ValueError(f"DecodeTables: k_cache {tuple(k_cache.shape)} != v_cache {tuple(v_cache.shape)}")
        num_slots = k_cache.shape[1]
        if block_size < 1 or block_table.shape[1] < 1:
            raise ValueError("DecodeTables: block_size and the block table width must be >= 1")
        if t > MAX_LINEAR_ROWS or t < 1:
            raise ValueError(f"DecodeTables: {t} tokens; the decode layer takes 1..{MAX_LINEAR_ROWS}")
        # checked on numpy views: a torch op costs ~5 us of dispatch once a forward pass has left
        # the caches cold, and these eight ran every decode step
        sl, bt, cl = slots.numpy(), block_table.numpy(), ctx_lens.numpy()
        if not np.array_equal(tokens.numpy(), np.arange(t)):
            raise ValueError("DecodeTables: token t must be sequence t's query (a decode-only step)")
        if int(sl.min()) < 0 or int(sl.max()) >= num_slots:
            raise ValueError(f"DecodeTables: a slot lies outside [0, {num_slots})")
        width = block_table.shape[1]
        if int(bt.min()) < 0 or int(bt.max()) * block_size >= num_slots:
            raise ValueError(f"DecodeTables: a block id lies outside the pool of {num_slots // block_size} blocks")
        if int(cl.min()) < 1 or int(cl.max()) > width * block_size:
            raise ValueError(f"DecodeTables: ctx_lens must be in [1, {width * block_size}]")
        self.num_tokens, self.block_size, self.width = t, block_size, width
        self.keep = (slots, tokens, block_table, ctx_lens, k_cache, v_cache)
        self.ptrs = (slots.data_ptr(), tokens.data_ptr(), block_table.data_ptr(), ctx_lens.data_ptr())
        self.k_base, self.v_base = k_cache.data_ptr(), v_cache.data_ptr()
        self.num_layers = k_cache.shape[0]
        self.layer_bytes = k_cache[0].numel() * k_cache.element_size()
        self.kv_shape = tuple(k_cache.shape[2:])
        self.kv_bf16 = kv_dtype is torch.bfloat16


class DecodeStep(NamedTuple):
    """A step's inputs checked and packed once for every layer call (``decode_step``)."""

    spec: object  # the C side's packed copy (``step_spec``)
    tables: DecodeTables
    keep: tuple[torch.Tensor, ...]
    num_tokens: int
    hidden: int
    head_dim: int


def decode_step(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tables: DecodeTables,
                timers: tuple[int, int, int] = (0, 0, 0)) -> DecodeStep:
    """The step's ``x [T, H]`` fp32 (updated in place by ``run_layer``) and ``cos``/``sin``
    ``[T, head_dim]``, checked against ``tables``. ``timers``: (pointer, threads, clock) of
    ``StepTimers.kernel_args()``, the accumulators each thread adds its phase times to and its
    clock (1: CPU time, 0: wall; ``model/step_timers.py``); ``(0, 0, 0)``: no timing."""
    require(x, "x", 2)
    require(cos, "cos", 2)
    require(sin, "sin", 2)
    t = tables.num_tokens
    if x.shape[0] != t or cos.shape != sin.shape or cos.shape[0] != t:
        raise ValueError(f"decode_layer: x {tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)} "
                         f"for {t} tokens")
    slots, tok, bt, cl = tables.ptrs
    spec = lib().step_spec(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), tables.k_base, tables.v_base, slots, tok, bt,
                           cl, tables.layer_bytes, t, tables.width, tables.block_size, *timers, int(tables.kv_bf16))
    return DecodeStep(spec, tables, (x, cos, sin), t, x.shape[1], cos.shape[1])


def _out(t: torch.Tensor | None, name: str, shape: tuple[int, int], dtype: torch.dtype) -> int:
    if t is None:
        return 0
    if t.dtype != dtype or not t.is_cpu or not t.is_contiguous() or tuple(t.shape) != shape:
        raise ValueError(f"decode_layer: {name} must be contiguous {dtype} {shape}, got {t.dtype} {tuple(t.shape)}")
    return t.data_ptr()


def run_layer(layer: int, w: LayerWeights, step: DecodeStep, h_out: torch.Tensor | None = None,
              logits_out: torch.Tensor | None = None, ids_out: torch.Tensor | None = None,
              wts_out: torch.Tensor | None = None, forced: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Layer ``layer`` of the step in place on its ``x``: attention block, residual, post-norm, then
    by ``w``: the dense MLP and its residual; the router logits into ``logits_out [T, E]`` with the
    post-norm rows into ``h_out [T, H]`` (the caller's experts read them); or routing into
    ``ids_out`` int64 / ``wts_out`` fp32 ``[T, top_k]`` and the experts' sum into the residual.
    ``forced``: (mask bool/uint8 ``[T]``, ids int64 ``[T, top_k]``), routes replayed where the mask
    is set (an id outside ``[0, E)`` is a ``ValueError``)."""
    t, tables = step.num_tokens, step.tables
    if step.hidden != w.hidden or step.head_dim != w.head_dim or not 0 <= layer < tables.num_layers \
            or tables.kv_shape != (w.num_kv_heads, w.head_dim):
        raise ValueError(f"decode_layer: layer {layer}: the step (hidden {step.hidden}, head_dim {step.head_dim}, KV "
                         f"{tables.kv_shape}) does not fit its weights")
    h_ptr = _out(h_out, "h_out", (t, w.hidden), torch.float32)
    logits_ptr = _out(logits_out, "logits_out", (t, w.num_experts), torch.float32)
    ids_ptr = _out(ids_out, "ids_out", (t, w.top_k), torch.int64)
    wts_ptr = _out(wts_out, "wts_out", (t, w.top_k), torch.float32)
    if w.num_experts and not w.top_k and not (h_ptr and logits_ptr):
        raise ValueError("decode_layer: a router layer needs h_out [T, H] and logits_out [T, E] (fp32, contiguous)")
    mask_ptr = forced_ptr = 0
    if forced is not None:
        mask, ids = forced
        if mask.dtype not in (torch.bool, torch.uint8):
            raise ValueError(f"decode_layer: the forced mask must be bool or uint8, got {mask.dtype}")
        mask_ptr = _out(mask.view(1, -1), "forced mask", (1, t), mask.dtype)
        forced_ptr = _out(ids, "forced ids", (t, w.top_k), torch.int64)
    sync_threads()
    lib().decode_layer(w.spec, step.spec, layer, h_ptr, logits_ptr, ids_ptr, wts_ptr, forced_ptr, mask_ptr)


__all__ = ["DecodeStep", "DecodeTables", "LayerWeights", "decode_step", "layer_weights", "run_layer"]
