"""GGUF block kernels (execstate.kernels.gguf_blocks; C: gemm_gguf.c).

Oracles: the ``gguf`` package (its quantiser makes the blocks; its dequantisation must equal ours
bit for bit) and ``gguf_dot_reference``: the GGUF dot order written out in numpy with a correctly
rounded FMA. Every entry must equal it bit for bit: the AVX-512 kernels (blocks in registers for
few rows, dequantised blocks from scratch for many), the 8-lane AVX2 kernels, any row count
(a row alone equals it in a batch), any thread count; the fused MoE equals its slots computed
one by one; bad input is a ValueError before C sees a pointer.
"""

from __future__ import annotations

import pytest
import torch
from gguf_reference import gguf_dequantize, gguf_dot_reference, quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import randn, with_threads

from execstate.kernels import cpu, ext, gguf_blocks
from execstate.kernels.weight_format import WeightFormat

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")
FORMATS = [WeightFormat.Q8_0, WeightFormat.Q4_0, WeightFormat.Q4_1]
AVX2 = [1, 0] if cpu.PACKED else [1]  # the 8-lane kernels always; the AVX-512 ones where they run


def call(x: torch.Tensor, w: torch.Tensor, fmt: WeightFormat, avx2: int) -> torch.Tensor:
    y = torch.full((x.shape[0], w.shape[0]), float("nan"))
    ext.lib().linear_gguf(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], w.shape[0], int(fmt),
                          avx2)
    return y


def blocks(n: int, k: int, fmt: WeightFormat, seed: int) -> torch.Tensor:
    return quantize(randn(n, k, seed=seed) / k**0.5, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_equals_the_gguf_package(fmt: WeightFormat) -> None:
    w = blocks(37, 96, fmt, 1)
    assert w.shape == (37, 96 // 32 * {3: 34, 4: 18, 5: 20}[int(fmt)])
    assert torch.equal(gguf_blocks.dequantize(w, fmt), gguf_dequantize(w, fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_rows_equals_dequantize_of_the_rows(fmt: WeightFormat) -> None:
    """The embedding lookup's numpy path: the rows' values bit for bit (negative scales and, in
    Q4_1, negative minimums included), in the order of ``ids``, repeats kept."""
    w = blocks(53, 96, fmt, 3)
    w.view(53, 3, -1)[::2, :, 1] |= 0x80  # every other row: negative scales (the fp16 sign bit)
    if fmt is WeightFormat.Q4_1:
        w.view(53, 3, -1)[1::3, :, 3] ^= 0x80  # and flipped minimums
    for ids in ([0], [52], [7, 0, 52, 7], list(range(53))):
        t = torch.tensor(ids)
        got = gguf_blocks.dequantize_rows(w, t, fmt)
        assert got.dtype == torch.float32 and got.shape == (len(ids), 96)
        assert torch.equal(got.view(torch.int32), gguf_blocks.dequantize(w[t], fmt).view(torch.int32))
        assert torch.equal(got, gguf_dequantize(w[t].contiguous(), fmt))
    with pytest.raises(ValueError, match="whole Q8_0 blocks"):
        gguf_blocks.dequantize_rows(torch.zeros((2, 33), dtype=torch.uint8), torch.tensor([0]), WeightFormat.Q8_0)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 21), kb=st.integers(1, 9), n=st.integers(1, 41), fmt=st.sampled_from(FORMATS),
       seed=st.integers(0, 2**16))
def test_every_entry_equals_the_reference_bit_for_bit(m: int, kb: int, n: int, fmt: WeightFormat, seed: int) -> None:
    x, w = randn(m, 32 * kb, seed=seed), blocks(n, 32 * kb, fmt, seed + 1)
    want = gguf_dot_reference(x, gguf_blocks.dequantize(w, fmt))
    for avx2 in AVX2:
        assert torch.equal(call(x, w, fmt, avx2), want), f"avx2={avx2}"
    assert torch.equal(gguf_blocks.linear_gguf(x, w, fmt), want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("m", "n"), [(1, 1), (1, 7), (1, 8), (1, 9), (1, 77), (9, 23), (17, 77)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_one_row_tiles_equal_the_reference(threads: int, m: int, n: int, fmt: WeightFormat) -> None:
    """A lone x row (or the one left after the 8-row tiles) takes 8 weight rows a tile, fewer at the
    end of a thread's share (1 x 1024 x 77 is past the kernels' team threshold): every edge equals
    the reference bit for bit."""
    x, w = randn(m, 1024, seed=n), blocks(n, 1024, fmt, m + n)
    want = gguf_dot_reference(x, gguf_blocks.dequantize(w, fmt))
    for avx2 in AVX2:
        assert torch.equal(with_threads(threads, lambda a=avx2: call(x, w, fmt, a)), want), f"avx2={avx2}"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("m", "k", "n"), [(70, 576, 150), (9, 1536, 576), (3, 576, 1536)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_alone_equals_it_in_the_batch(threads: int, m: int, k: int, n: int, fmt: WeightFormat) -> None:
    x, w = randn(m, k, seed=m), blocks(n, k, fmt, k)
    want = gguf_dot_reference(x, gguf_blocks.dequantize(w, fmt))
    got = with_threads(threads, lambda: gguf_blocks.linear_gguf(x, w, fmt))
    assert torch.equal(got, want)
    for i in (0, m // 2, m - 1):
        for avx2 in AVX2:
            assert torch.equal(call(x[i : i + 1].contiguous(), w, fmt, avx2)[0], got[i])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t", [1, 6, 40])
def test_moe_equals_its_slots_computed_one_by_one(fmt: WeightFormat, t: int) -> None:
    e, h, i, k = 8, 64, 96, 2
    x = randn(t, h, seed=t)
    ids = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(s))[:k] for s in range(t)])
    wts = torch.softmax(randn(t, k, seed=t + 1), -1)
    w_gu = blocks(e * 2 * i, h, fmt, 3).view(e, 2 * i, -1)
    w_d = blocks(e * h, i, fmt, 4).view(e, h, -1)
    want = torch.empty(t, h)
    for r in range(t):
        ys = []
        for j in range(k):
            ex = int(ids[r, j])
            gu = gguf_blocks.linear_gguf(x[r : r + 1], w_gu[ex], fmt)
            ys.append(gguf_blocks.linear_gguf(cpu.silu_mul(gu), w_d[ex], fmt)[0])
        s = wts[r, 0] * ys[0]
        for j in range(1, k):
            s = s + wts[r, j] * ys[j]
        want[r] = s
    assert torch.equal(gguf_blocks.moe_gguf(x, ids, wts, w_gu, w_d, fmt), want)
    for avx2 in AVX2:
        out = torch.full_like(x, float("nan"))
        ext.lib().moe_gguf(x.data_ptr(), ids.data_ptr(), wts.data_ptr(), w_gu.data_ptr(), w_d.data_ptr(),
                           out.data_ptr(), t, k, e, h, i, int(fmt), avx2)
        assert torch.equal(out, want)


def test_bad_input_is_a_value_error_before_c() -> None:
    fmt = WeightFormat.Q4_1
    x, w = randn(2, 64, seed=0), blocks(3, 64, fmt, 1)
    with pytest.raises(ValueError, match="uint8"):
        gguf_blocks.linear_gguf(x, w.float(), fmt)
    with pytest.raises(ValueError, match="bytes a row"):
        gguf_blocks.linear_gguf(x, blocks(3, 64, WeightFormat.Q8_0, 1), fmt)
    with pytest.raises(ValueError, match="multiple of 32"):
        gguf_blocks.linear_gguf(randn(2, 48, seed=0), w, fmt)
    with pytest.raises(ValueError, match="block format"):
        gguf_blocks.linear_gguf(x, w, WeightFormat.BF16_DOT)
    w_gu, w_d = blocks(8 * 64, 64, fmt, 2).view(8, 64, -1), blocks(8 * 64, 32, fmt, 3).view(8, 64, -1)
    with pytest.raises(ValueError, match="expert id"):
        gguf_blocks.moe_gguf(x[:1], torch.tensor([[0, 8]]), torch.ones(1, 2), w_gu, w_d, fmt)
    with pytest.raises(ValueError, match="down experts"):
        gguf_blocks.moe_gguf(x[:1], torch.tensor([[0, 1]]), torch.ones(1, 2), w_gu, w_d[:4], fmt)
