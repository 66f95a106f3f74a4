"""bf16 arithmetic kernels (execstate.kernels.gemm_bf16dot; C: gemm_bf16dot.c, gemm_bf16dot_emu.c).

Oracle: ``bf16dot_reference`` below, the "bf16 dot order" written out in numpy float32 (x rounded
to bf16 per element, 16 lanes over 32-column chunks, lane j adding the odd product then the even
one, each add rounded, then the lane tree). Every kernel must equal it bit for bit (the test data
stay in the normal range, where vdpbf16ps's subnormal flushing never acts): the AVX512-BF16
entries, their AVX2 emulation, any row count (a row alone equals the same row in a batch), any
thread count, K with and without a 32-column tail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import linear_call, moe_call, randn, with_threads

from execstate.kernels import cpu, ext, gemm_bf16dot

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")
NATIVE = gemm_bf16dot.NATIVE
ENTRIES = ["linear_bf16dot_emu"] + (["linear_bf16dot"] if NATIVE else [])
MOE_ENTRIES = ["moe_bf16dot_emu"] + (["moe_bf16dot"] if NATIVE else [])


def bf16_values(t: torch.Tensor) -> np.ndarray:
    """``t`` rounded to bf16 (nearest even), as float32 values."""
    return t.to(torch.bfloat16).float().numpy()


def bf16dot_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``bf16(x) @ w.T`` in the bf16 dot order (see the module docstring); float32 ``[M, N]``."""
    xb, wb = bf16_values(x), w.float().numpy()
    m, k = xb.shape
    kp = -(-k // 32) * 32
    xb = np.pad(xb, ((0, 0), (0, kp - k))).reshape(m, kp // 32, 16, 2)
    wb = np.pad(wb, ((0, 0), (0, kp - k))).reshape(wb.shape[0], kp // 32, 16, 2)
    acc = np.zeros((m, wb.shape[0], 16), dtype=np.float32)
    for c in range(kp // 32):
        acc = acc + xb[:, None, c, :, 1] * wb[None, :, c, :, 1]
        acc = acc + xb[:, None, c, :, 0] * wb[None, :, c, :, 0]
    s = acc[..., :8] + acc[..., 8:]
    s = s[..., :4] + s[..., 4:]
    s = s[..., :2] + s[..., 2:]
    return torch.from_numpy(s[..., 0] + s[..., 1])


def weights_bf16(n: int, k: int, seed: int) -> torch.Tensor:
    return (randn(n, k, seed=seed) / k**0.5).to(torch.bfloat16)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 37), k=st.integers(1, 200), n=st.integers(1, 41), seed=st.integers(0, 2**16))
def test_every_entry_equals_the_reference_bit_for_bit(m: int, k: int, n: int, seed: int) -> None:
    x, w = randn(m, k, seed=seed), weights_bf16(n, k, seed + 1)
    want = bf16dot_reference(x, w)
    for name in ENTRIES:
        got = linear_call(name, x, w)
        assert torch.equal(got, want), name
    assert torch.equal(gemm_bf16dot.linear_bf16dot(x, w), want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("m", "k", "n"),
                         [(300, 512, 96), (129, 576, 70), (33, 768, 512), (8, 1536, 576), (387, 100, 37), (257, 33, 9)])
def test_many_rows_a_row_alone_equals_it_in_the_batch(threads: int, m: int, k: int, n: int) -> None:
    x, w = randn(m, k, seed=m), weights_bf16(n, k, k)
    want = bf16dot_reference(x, w)
    for name in ENTRIES:
        got = with_threads(threads, lambda name=name: linear_call(name, x, w))
        assert torch.equal(got, want), name
        for i in (0, m // 2, m - 1):
            assert torch.equal(linear_call(name, x[i : i + 1].contiguous(), w)[0], got[i])


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("m", "k", "n"), [(1030, 96, 1024), (1023, 100, 1024), (129, 40, 129), (129, 40, 130)])
def test_many_rows_split_by_rows_or_columns_equals_the_reference(threads: int, m: int, k: int, n: int) -> None:
    """Many rows: with N <= M (the prefill's q/k/v and o-proj) each thread multiplies its own rows
    against every weight row, else its weight rows against every row; either side of the boundary,
    on uneven shares, every output equals the reference bit for bit and nothing past y is written."""
    x, w = randn(m, k, seed=m), weights_bf16(n, k, k)
    want = bf16dot_reference(x, w)
    for name in ENTRIES:
        buf = torch.full((m * n + 64,), float("nan"))
        with_threads(threads, lambda name=name, buf=buf: getattr(ext.lib(), name)(
            x.data_ptr(), w.data_ptr(), buf.data_ptr(), m, k, n))
        assert torch.equal(buf[: m * n].view(m, n), want), name
        assert torch.isnan(buf[m * n:]).all(), name


def test_rounds_activations_not_weights_and_flushes_subnormals() -> None:
    w = torch.ones(1, 32, dtype=torch.bfloat16)
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0 + 2.0**-8  # a tie between two bf16 values: rounds to even (1.0)
    x[0, 1] = 1.0 + 3 * 2.0**-8  # rounds up to 1 + 2^-6
    x[0, 2] = 1e-40  # subnormal: zero
    for name in ENTRIES:
        assert linear_call(name, x, w).item() == 1.0 + 1.0 + 2.0**-6


def moe_reference(x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, w_gu: torch.Tensor,
                  w_d: torch.Tensor) -> torch.Tensor:
    """The MoE block slot by slot: each slot's rows by bf16dot_reference, summed in slot order."""
    t, k = ids.shape
    want = torch.empty(t, x.shape[1])
    for r in range(t):
        ys = []
        for j in range(k):
            ex = int(ids[r, j])
            gu = bf16dot_reference(x[r : r + 1], w_gu[ex])
            ys.append(bf16dot_reference(cpu.silu_mul(gu), w_d[ex])[0])
        s = wts[r, 0] * ys[0]
        for j in range(1, k):
            s = s + wts[r, j] * ys[j]
        want[r] = s
    return want


@pytest.mark.parametrize("threads", [1, 2])
def test_moe_with_skewed_routing_equals_its_slots_on_any_thread_count(threads: int) -> None:
    """The threads split the experts' rows by work (slot rows x weight rows), so with skewed
    routing a busy expert's rows are shared and idle experts' rows go whole to one thread: no
    row may be left out or computed twice. Experts 1 and 6 take most slots, expert 3 one, 0
    none; every output equals the slot-by-slot reference."""
    e, h, i, k, t = 8, 96, 64, 2, 150
    rng = torch.Generator().manual_seed(9)
    first = torch.where(torch.rand(t, generator=rng) < 0.7, 1, 6)
    second = torch.randint(4, 8, (t,), generator=rng)
    second = torch.where(second == first, 7 - (first == 7).long(), second)
    second[5] = 3
    ids = torch.stack([first, second], dim=1).to(torch.int64)
    wts = torch.softmax(randn(t, k, seed=10), -1)
    x = randn(t, h, seed=11)
    w_gu, w_d = weights_bf16(e * 2 * i, h, 12).view(e, 2 * i, h), weights_bf16(e * h, i, 13).view(e, h, i)
    want = moe_reference(x, ids, wts, w_gu, w_d)
    poison = torch.full_like(x, float("nan"))
    for name in MOE_ENTRIES:
        with_threads(1, lambda name=name: moe_call(name, poison, ids, wts, w_gu, w_d))  # NaN in every temporary row
        got = with_threads(threads, lambda name=name: moe_call(name, x, ids, wts, w_gu, w_d))
        assert torch.equal(got, want), name


@pytest.mark.parametrize("t", [1, 5, 64, 200])
def test_moe_equals_its_slots_computed_one_by_one(t: int) -> None:
    e, h, i, k = 8, 96, 64, 2
    x = randn(t, h, seed=t)
    ids = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(s))[:k] for s in range(t)])
    wts = torch.softmax(randn(t, k, seed=t + 1), -1)
    w_gu, w_d = weights_bf16(e * 2 * i, h, 3).view(e, 2 * i, h), weights_bf16(e * h, i, 4).view(e, h, i)
    want = moe_reference(x, ids, wts, w_gu, w_d)
    for name in MOE_ENTRIES:
        assert torch.equal(moe_call(name, x, ids, wts, w_gu, w_d), want), name
    assert torch.equal(gemm_bf16dot.moe_bf16dot(x, ids, wts, w_gu, w_d), want)


@pytest.mark.skipif(not NATIVE, reason="the fused MoE is the AVX512-BF16 kernel's")
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("t", "h", "i", "k"), [(37, 160, 224, 2), (300, 64, 416, 2), (90, 96, 96, 1)])
def test_fused_moe_blocks_and_tails_equal_its_slots(threads: int, t: int, h: int, i: int, k: int) -> None:
    """64 or more slots with H and I multiples of 32 take the fused kernel (moe_bf16dot.c): h's
    columns split by thread in 32s and then in blocks of 96 (a ragged last block), an expert's
    slot rows in blocks of 128 (expert 1 has more), out's columns split by thread with tiles of
    6 and a tail; with k = 1 each slot's row is stored, with k = 2 a token's second slot is
    added. Every output equals the slot-by-slot reference, from NaN-filled temporaries."""
    e = 8
    rng = torch.Generator().manual_seed(t + h + i)
    first = torch.where(torch.rand(t, generator=rng) < 0.6, 1, torch.randint(0, e, (t,), generator=rng))
    cols = [first]
    if k == 2:
        second = torch.randint(0, e - 1, (t,), generator=rng)
        cols.append(second + (second >= first).long())  # another expert than the first
    ids = torch.stack(cols, dim=1).to(torch.int64)
    wts = torch.softmax(randn(t, k, seed=t), -1)
    x = randn(t, h, seed=t + 1)
    w_gu, w_d = weights_bf16(e * 2 * i, h, 5).view(e, 2 * i, h), weights_bf16(e * h, i, 6).view(e, h, i)
    want = moe_reference(x, ids, wts, w_gu, w_d)
    with_threads(threads, lambda: moe_call("moe_bf16dot", torch.full_like(x, float("nan")), ids, wts, w_gu, w_d))
    got = with_threads(threads, lambda: moe_call("moe_bf16dot", x, ids, wts, w_gu, w_d))
    assert torch.equal(got, want)


def test_bad_input_is_a_value_error_before_c() -> None:
    x, w = randn(2, 8, seed=0), weights_bf16(3, 8, 1)
    with pytest.raises(ValueError, match="bfloat16"):
        gemm_bf16dot.linear_bf16dot(x, w.float())
    with pytest.raises(ValueError, match="features"):
        gemm_bf16dot.linear_bf16dot(randn(2, 9, seed=0), w)
    with pytest.raises(ValueError, match="contiguous"):
        gemm_bf16dot.linear_bf16dot(randn(8, 2, seed=0).t(), w)
    ids = torch.tensor([[0, 9]])
    with pytest.raises(ValueError, match="expert id"):
        gemm_bf16dot.moe_bf16dot(randn(1, 8, seed=0), ids, torch.ones(1, 2), weights_bf16(8 * 4, 8, 2).view(8, 4, 8),
                                 weights_bf16(8 * 8, 2, 3).view(8, 8, 2))
