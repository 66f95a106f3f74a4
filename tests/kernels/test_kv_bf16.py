"""bf16 attention (``kv_cache_dtype="bfloat16"``): the paged attention kernel on bf16 K/V caches.

Oracles: (1) the fp32 kernel on caches holding the widened bf16 values, bit for bit (widening is
exact and the arithmetic is the same, so this is the mode's contract); (2) a numpy float64
softmax attention over the widened values; (3) a numpy round-to-nearest-even of the fp32 bits for
the pool's fp32 -> bf16 stores (ties to even, NaN kept a NaN). Shapes drawn by hypothesis: query
heads per KV head 1-4, head_dim 64 (AVX-512 head pairs) and 40 (8-lane tail), blocks of 16 and 5,
contexts across several blocks, decode plans and prefill spans, 1 and 2 threads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import with_threads

from execstate.kernels import cpu
from execstate.kernels.paged_decode import MAX_TILED_GROUP, PagedDecode
from execstate.state.kv_pool import KVPool

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")


def _rne_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even, on the integer bits (the reference)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def _widen(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _case(seed: int, nkv: int, group: int, d: int, bs: int, ctx: list[int], queries: list[int]):
    g = torch.Generator().manual_seed(seed)
    nh = nkv * group
    blocks = sum(-(-n // bs) for n in ctx) + 3
    k32 = torch.randn(blocks * bs, nkv, d, generator=g) * 2.0
    v32 = torch.randn(blocks * bs, nkv, d, generator=g)
    perm = torch.randperm(blocks, generator=g).tolist()
    tables, at = [], 0
    for n in ctx:
        tables.append(perm[at : at + -(-n // bs)])
        at += len(tables[-1])
    rows = sum(queries)
    q = torch.randn(rows, nh, d, generator=g)
    return q, k32.to(torch.bfloat16), v32.to(torch.bfloat16), tables


def _run(plan: PagedDecode, q, kc, vc, scale: float, threads: int) -> torch.Tensor:
    out = torch.full_like(q, float("nan"))
    with_threads(threads, lambda: plan.run(q, kc, vc, out, scale))
    return out


def _reference(q, kc, vc, starts, queries, tables, ctx, bs, scale) -> np.ndarray:
    qn = q.double().numpy()
    k = _widen(kc.view(torch.int16).numpy().view(np.uint16)).astype(np.float64)
    v = _widen(vc.view(torch.int16).numpy().view(np.uint16)).astype(np.float64)
    out = np.zeros_like(qn)
    group = q.shape[1] // k.shape[1]
    for s0, nq, table, n in zip(starts, queries, tables, ctx, strict=True):
        for i in range(nq):
            length = n - nq + i + 1
            slots = [table[p // bs] * bs + p % bs for p in range(length)]
            kk = np.repeat(k[slots], group, axis=1)  # [L, nh, d]
            vv = np.repeat(v[slots], group, axis=1)
            sc = np.einsum("hd,lhd->hl", qn[s0 + i], kk) * scale
            p = np.exp(sc - sc.max(axis=1, keepdims=True))
            out[s0 + i] = np.einsum("hl,lhd->hd", p / p.sum(axis=1, keepdims=True), vv)
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), nkv=st.integers(1, 3), group=st.integers(1, 4), d=st.sampled_from([64, 40]),
       bs=st.sampled_from([16, 5]), lens=st.lists(st.integers(1, 70), min_size=1, max_size=4),
       prefill=st.booleans(), threads=st.sampled_from([1, 2]))
def test_bf16_kv_equals_fp32_kernel_on_widened_values(seed, nkv, group, d, bs, lens, prefill, threads) -> None:
    queries = [min(n, 1 + n // 3) if prefill else 1 for n in lens]
    q, kc, vc, tables = _case(seed, nkv, group, d, bs, lens, queries)
    starts = np.cumsum([0, *queries[:-1]]).tolist()
    slots = kc.shape[0]
    plan = PagedDecode.for_spans(starts, queries, tables, lens, bs, slots) if prefill else \
        PagedDecode(starts, tables, lens, bs, slots)
    scale = d**-0.5
    got = _run(plan, q, kc, vc, scale, threads)
    want = _run(plan, q, kc.float(), vc.float(), scale, threads)
    assert torch.equal(got, want)  # bit for bit: exact widening, the same fp32 arithmetic
    ref = _reference(q, kc, vc, starts, queries, tables, lens, bs, scale)
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=2e-5, atol=2e-6)


def test_bf16_kv_reads_the_rounded_values_not_fp32_ones() -> None:
    """The same K/V stored fp32 and bf16 give different outputs (the storage is what is read),
    and the bf16 one is what float64 attention over the rounded values gives."""
    g = torch.Generator().manual_seed(3)
    d, bs, n = 64, 16, 50
    k32, v32 = torch.randn(4 * bs, 2, d, generator=g), torch.randn(4 * bs, 2, d, generator=g)
    q = torch.randn(1, 4, d, generator=g)
    plan = PagedDecode([0], [[2, 0, 3, 1]], [n], bs, 4 * bs)
    fp32 = _run(plan, q, k32, v32, d**-0.5, 1)
    bf16 = _run(plan, q, k32.to(torch.bfloat16), v32.to(torch.bfloat16), d**-0.5, 1)
    assert not torch.equal(fp32, bf16)
    assert (fp32 - bf16).abs().max() < 0.02
    ref = _reference(q, k32.to(torch.bfloat16), v32.to(torch.bfloat16), [0], [1], [[2, 0, 3, 1]], [n], bs, d**-0.5)
    np.testing.assert_allclose(bf16.double().numpy(), ref, rtol=2e-5, atol=2e-6)


def test_pool_rounds_to_nearest_even() -> None:
    """KVPool.write into a bf16 pool: the numpy reference's bits, exact ties to even included."""
    pool = KVPool(1, 1, 8, 1, 8, torch.bfloat16)
    vals = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20, 3.0e38, 1e-40, 0.0, -0.0] * 8,
                    dtype=np.float32).reshape(8, 1, 8)
    x = torch.from_numpy(vals)
    pool.write(0, torch.arange(8), x, -x)
    assert pool.k.view(torch.int16).numpy().view(np.uint16).reshape(-1).tolist() == _rne_bf16_bits(vals).reshape(
        -1).tolist()
    assert _rne_bf16_bits(np.float32([1 + 2**-8, 1 + 3 * 2**-8])).tolist() == [0x3F80, 0x3F82]  # ties to even
    assert np.isnan(_widen(_rne_bf16_bits(np.float32([np.nan])))[0])


def test_bad_inputs() -> None:
    plan = PagedDecode([0], [[0]], [4], 16, 16)
    q = torch.zeros(1, 4, 8)
    kb = torch.zeros(16, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="v_cache must be a contiguous bfloat16"):
        plan.run(q, kb, torch.zeros(16, 2, 8), torch.empty_like(q), 1.0)
    with pytest.raises(ValueError, match="q must be a contiguous float32"):
        plan.run(q.bfloat16(), kb, kb, torch.empty_like(q), 1.0)
    big = torch.zeros(1, MAX_TILED_GROUP + 1, 8)
    kb1 = torch.zeros(16, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="at most 16 query heads per KV head"):
        plan.run(big, kb1, kb1, torch.empty_like(big), 1.0)
