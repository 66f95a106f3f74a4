"""The prefill path's fusions on the CPU kernels: k/v stored straight into the KV cache by the
q/k/v split (``cpu.qkv_rope_to_cache``, ``PagedAttention.cache_rows`` / ``attend``), that split
with QK-norm and RoPE as the q/k/v projection's epilogue (``cpu.linear_qkv_rope_to_cache``,
``Attention._fused_projection``) and each block's MLP residual add done with the next norm
(``DecoderLayer.forward_parts``).

Oracle: the same model with both switched off (``cache_rows`` None: q/k/v tensors and the pool's
own write; ``fuses_residuals`` False: the block's ``forward``). The numerics contract says they
change no bit, so hidden states, routes and every K/V row of the pool must be equal bit for bit,
for prefills with and without cached context, in fp32 and bf16 arithmetic, on 1 and 2 threads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_helpers import with_threads

from execstate.kernels import cpu, gemm_bf16dot
from execstate.model.context import RouteCapture, StepContext
from execstate.model.decoder_layer import DecoderLayer
from execstate.model.layers import Attention
from execstate.model.loader import load_model
from execstate.model.paged_attention import PagedAttention, SeqSpan
from execstate.model.random_models import make_random
from execstate.model.weight_formats import use_bf16_arithmetic
from execstate.state.kv_pool import KVPool

BS = 4
ARCHES = ("qwen3_moe", "qwen2_moe", "llama", "olmoe")  # QK-norm, shared expert + q/k/v bias, dense + bias, clip_qkv


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, object]:
    return {a: make_random(a, tmp_path_factory.mktemp(a), seed=5) for a in ARCHES}


def _model(path, mode: str):
    model = load_model(path)
    if mode == "bf16":
        model.store_weights_bf16()
        use_bf16_arithmetic(model)
    model.use_cpu_kernels(True)
    return model


def _run(model, lens: list[int], cached: list[int], kv_dtype: torch.dtype, seed: int):
    """Prefill of ``lens[i]`` new tokens after ``cached[i]`` cached ones per sequence (the cached
    part prefilled in an earlier step); returns the second step's hidden states, routes and pool."""
    cfg = model.config
    pool = KVPool(cfg.num_layers, 96, BS, cfg.num_kv_heads, cfg.head_dim, kv_dtype)
    perm = torch.randperm(96, generator=torch.Generator().manual_seed(seed)).tolist()  # scattered blocks
    gen = torch.Generator().manual_seed(seed)
    tables, ids, at = [], [], 0
    for n, c in zip(lens, cached, strict=True):
        k = -(-(n + c) // BS)
        tables.append(perm[at : at + k])
        at += k
        ids.append(torch.randint(3, cfg.vocab_size, (n + c,), generator=gen))

    def step(spans: list[SeqSpan], tokens: torch.Tensor, pos: torch.Tensor):
        att = PagedAttention(pool, spans, use_kernels=True)
        routes = RouteCapture(len(tokens), cfg.num_moe_layers, cfg.top_k) if cfg.is_moe else None
        with torch.inference_mode(), StepContext(pos, att, routes) as ctx:
            hidden = model(tokens, ctx)
        return hidden, None if routes is None else routes.ids

    first = [(i, c) for i, c in enumerate(cached) if c]
    if first:
        spans, starts = [], 0
        for i, c in first:
            spans.append(SeqSpan(starts, c, c, tables[i]))
            starts += c
        step(spans, torch.cat([ids[i][:c] for i, c in first]), torch.cat([torch.arange(c) for _, c in first]))
    spans, starts = [], 0
    for i, (n, c) in enumerate(zip(lens, cached, strict=True)):
        spans.append(SeqSpan(starts, n, n + c, tables[i]))
        starts += n
    tokens = torch.cat([ids[i][c:] for i, c in enumerate(cached)])
    pos = torch.cat([torch.arange(c, c + n) for n, c in zip(lens, cached, strict=True)])
    hidden, routes = step(spans, tokens, pos)
    return hidden, routes, pool


def _both(model, monkeypatch: pytest.MonkeyPatch, threads: int, **kw):
    fused = with_threads(threads, lambda: _run(model, **kw))
    with monkeypatch.context() as m:
        m.setattr(PagedAttention, "cache_rows", lambda self, layer_idx: None)
        m.setattr(DecoderLayer, "fuses_residuals", lambda self, x: False)
        plain = with_threads(threads, lambda: _run(model, **kw))
    return fused, plain


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("arch", ARCHES)
def test_fused_prefill_equals_the_unfused_path_bitwise(model_dirs, arch: str, mode: str, threads: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(model_dirs[arch], mode)
    # a step of 2 x 41 + 17 rows (past the whole-layer decode path's 32), one span after cached context
    kw = dict(lens=[41, 41, 17], cached=[0, 7, 0], kv_dtype=torch.float32, seed=11)
    (h, r, pool), (h0, r0, pool0) = _both(model, monkeypatch, threads, **kw)
    assert h.shape == (99, model.config.hidden_size) and torch.isfinite(h).all()
    assert torch.equal(h, h0)
    assert (r is None and r0 is None) or torch.equal(r, r0)
    assert torch.equal(pool.k, pool0.k) and torch.equal(pool.v, pool0.v)
    assert pool.k.abs().sum() > 0  # the K/V rows were written


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("epilogue", ["q/k/v", "o-proj"])
def test_each_projections_epilogue_equals_the_pass_after_it_bitwise(model_dirs, epilogue: str, arch: str, mode: str,
                                                                    threads: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One projection's epilogue switched off against all on: the q/k/v projection then
    ``qkv_rope_to_cache``, or the o-proj then ``add_rms_norm``; steps of 99 rows (one span after
    cached context) and of 300 (blocks of the kernels' rows on each thread)."""
    model = _model(model_dirs[arch], mode)
    for kw in (dict(lens=[41, 41, 17], cached=[0, 7, 0], kv_dtype=torch.float32, seed=12),
               dict(lens=[300], cached=[0], kv_dtype=torch.float32, seed=13)):
        h, r, pool = with_threads(threads, lambda kw=kw: _run(model, **kw))
        with monkeypatch.context() as m:
            if epilogue == "q/k/v":
                m.setattr(Attention, "_fused_projection", lambda self, x, cos, sin, ctx: None)
            else:
                m.setattr(Attention, "projects_with_norm", lambda self, rows: False)
            h0, r0, pool0 = with_threads(threads, lambda kw=kw: _run(model, **kw))
        assert torch.isfinite(h).all() and torch.equal(h, h0)
        assert (r is None and r0 is None) or torch.equal(r, r0)
        assert torch.equal(pool.k, pool0.k) and torch.equal(pool.v, pool0.v)


def test_the_fusions_are_taken_and_a_bf16_pool_keeps_the_pools_write(model_dirs,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(model_dirs["qwen3_moe"], "fp32")
    calls = {"rows": 0, "parts": 0}
    real_rows, real_parts = PagedAttention.cache_rows, DecoderLayer.forward_parts

    def rows(self, layer_idx):
        out = real_rows(self, layer_idx)
        calls["rows"] += out is not None
        return out

    def parts(self, *a, **k):
        calls["parts"] += 1
        return real_parts(self, *a, **k)

    calls.update(proj=0, o=0)
    real_proj, real_o = cpu.linear_qkv_rope_to_cache, cpu.linear_add_rms_norm

    def proj(*a, **k):
        calls["proj"] += 1
        return real_proj(*a, **k)

    def o_proj(*a, **k):
        calls["o"] += 1
        return real_o(*a, **k)

    monkeypatch.setattr(PagedAttention, "cache_rows", rows)
    monkeypatch.setattr(DecoderLayer, "forward_parts", parts)
    monkeypatch.setattr(cpu, "linear_qkv_rope_to_cache", proj)
    monkeypatch.setattr(cpu, "linear_add_rms_norm", o_proj)
    n_layers = model.config.num_layers
    _run(model, lens=[40], cached=[0], kv_dtype=torch.float32, seed=3)
    fused = n_layers if cpu.PACKED else 0
    assert calls == {"rows": n_layers, "parts": n_layers, "proj": fused, "o": fused}
    calls.update(rows=0, parts=0, proj=0, o=0)
    h, _, pool = _run(model, lens=[40], cached=[0], kv_dtype=torch.bfloat16, seed=3)
    assert calls == {"rows": 0, "parts": n_layers, "proj": 0, "o": fused}  # a bf16 pool: the pool rounds k/v itself
    assert pool.k.abs().sum() > 0 and torch.isfinite(h).all()
    calls.update(rows=0, parts=0, proj=0, o=0)
    _run(_model(model_dirs["qwen3_moe"], "bf16"), lens=[40], cached=[0], kv_dtype=torch.float32, seed=3)
    native = n_layers if gemm_bf16dot.NATIVE else 0
    assert calls["proj"] == calls["o"] == native  # bf16 arithmetic (not its emulation)
    calls.update(rows=0, parts=0, proj=0, o=0)
    olmoe = _model(model_dirs["olmoe"], "fp32")
    _run(olmoe, lens=[40], cached=[0], kv_dtype=torch.float32, seed=3)
    assert calls["proj"] == 0 and calls["o"] == olmoe.config.num_layers * bool(cpu.PACKED)  # clip_qkv: the torch split


def test_slot_mapping_of_long_and_short_spans_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans of many tokens get their slots as arrays (``_ARRAY_SPAN``), the others in Python: the
    mapping is token t's slot, block ``block_ids[pos // bs]`` times ``bs`` plus ``pos % bs``, in
    the step's token order, whichever way each span was computed."""
    import execstate.model.paged_attention as pa

    bs = 4
    pool = KVPool(1, 400, bs, 1, 8, torch.float32)
    perm = torch.randperm(400, generator=torch.Generator().manual_seed(9)).tolist()
    # (new tokens, context after the step): a decode, a long prefill after cached context, a short
    # chunk, a long prefill exactly at the threshold, one below it, a decode
    shapes = [(1, 30), (100, 130), (5, 9), (pa._ARRAY_SPAN, pa._ARRAY_SPAN), (pa._ARRAY_SPAN - 1, 70), (1, 2)]
    spans, at, start = [], 0, 0
    for n, ctx in shapes:
        k = -(-ctx // bs)
        spans.append(SeqSpan(start, n, ctx, np.asarray(perm[at : at + k])))
        at, start = at + k, start + n
    want = [int(s.block_ids[p // bs]) * bs + p % bs for s in spans for p in range(s.context_len - s.num_query,
                                                                                   s.context_len)]
    att = PagedAttention(pool, spans, use_kernels=True)
    assert att.slot_mapping.dtype == torch.int64 and att.slot_mapping.tolist() == want
    monkeypatch.setattr(pa, "_ARRAY_SPAN", 10**9)  # every span in Python: the same mapping
    assert PagedAttention(pool, spans, use_kernels=True).slot_mapping.tolist() == want
    monkeypatch.setattr(pa, "_ARRAY_SPAN", 1)  # every span as arrays, decodes included
    assert PagedAttention(pool, spans, use_kernels=True).slot_mapping.tolist() == want


def test_long_spans_on_the_torch_path_are_attended() -> None:
    """A span of ``_ARRAY_SPAN`` or more new tokens on the torch path (no kernels: SDPA per span)
    still gets its prefill entry beside its array-computed slots: the output equals the kernels'
    (to fp32 rounding), for a fresh prompt and one after cached context, beside a decode."""
    import execstate.model.paged_attention as pa

    bs, nh, nkv, d = 4, 4, 2, 16
    n_long = pa._ARRAY_SPAN + 5
    shapes = [(n_long, n_long), (1, 9), (n_long, n_long + 11)]  # (new tokens, context after the step)
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(4)).tolist()
    spans, at, start = [], 0, 0
    for n, ctx in shapes:
        k = -(-ctx // bs)
        spans.append(SeqSpan(start, n, ctx, perm[at : at + k]))
        at, start = at + k, start + n
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(start, h, d, generator=gen) for h in (nh, nkv, nkv))
    outs = []
    for kernels in (False, True):
        pool = KVPool(1, 200, bs, nkv, d, torch.float32)
        pool.k.normal_(generator=torch.Generator().manual_seed(6))  # the cached context
        pool.v.normal_(generator=torch.Generator().manual_seed(7))
        outs.append(PagedAttention(pool, spans, use_kernels=kernels).forward(0, q, k, v))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
