"""The AVX-512 register-blocked kernels (csrc/gemm_packed.c): ``linear_packed``, ``moe_packed``.

Oracles: the AVX2 kernels ``linear``/``moe`` (dot_rows), which the packed ones must equal bit
for bit on every shape (that is what keeps a row's result independent of the row count that
picks the kernel); float64 references; the batch-invariance contract (a row alone equals the
same row in a batch of any size, whichever kernel each call takes).
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import moe_call, randn, with_threads

from execstate.kernels import cpu, ext

pytestmark = pytest.mark.skipif(not cpu.PACKED, reason="no AVX-512 here: the packed kernels do not run")


def _linear_call(name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The C linear entry ``name`` called directly, into a NaN-filled output."""
    y = torch.full((x.shape[0], w.shape[0]), float("nan"))
    getattr(ext.lib(), name)(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], w.shape[0])
    return y


def _packed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _linear_call("linear_packed", x, w)


def _dot_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _linear_call("linear", x, w)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 80), n=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_linear_packed_equals_dot_rows_bitwise(m: int, k: int, n: int, seed: int) -> None:
    x, w = randn(m, k, seed=seed), randn(n, k, seed=seed + 1)
    got = _packed(x, w)
    assert torch.equal(got, _dot_rows(x, w))  # every element, every tile edge (odd M, N % 6, K % 8)
    torch.testing.assert_close(got.double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-5 * math.sqrt(k))


@pytest.mark.parametrize(("m", "k", "n"), [(2048, 512, 1024), (513, 768, 97), (300, 1000, 13)])
def test_linear_packed_large_shapes_bitwise_and_thread_count_invariant(m: int, k: int, n: int) -> None:
    x, w = randn(m, k, seed=m), randn(n, k, seed=n) / math.sqrt(k)
    one = with_threads(1, lambda: _packed(x, w))
    two = with_threads(2, lambda: _packed(x, w))
    assert torch.equal(one, two)
    assert torch.equal(one, _dot_rows(x, w))
    torch.testing.assert_close(one.double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 200), row=st.integers(0, 199), seed=st.integers(0, 2**16))
def test_linear_row_alone_equals_row_in_any_batch(m: int, row: int, seed: int) -> None:
    """Through the public ``cpu.linear``: M = 1 takes dot_rows, larger M the packed kernel."""
    row %= m
    x, w = randn(m, 64 + 3, seed=seed), randn(50, 64 + 3, seed=seed + 1)
    batch = cpu.linear(x, w)
    alone = cpu.linear(x[row : row + 1].contiguous(), w)
    assert torch.equal(batch[row], alone[0])


def _moe_inputs(t: int, e: int, h: int, i: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = randn(t, h, seed=seed)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    wts = torch.rand(t, k, generator=gen)
    w_gate_up = randn(e, 2 * i, h, seed=seed + 1) / math.sqrt(h)
    w_down = randn(e, h, i, seed=seed + 2) / math.sqrt(i)
    return x, ids, wts, w_gate_up, w_down


@settings(max_examples=30, deadline=None)
@given(t=st.integers(1, 90), e=st.integers(1, 9), h=st.integers(1, 40), i=st.integers(1, 30),
       k=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_moe_packed_equals_moe_bitwise(t: int, e: int, h: int, i: int, k: int, seed: int) -> None:
    k = min(k, e)
    args = _moe_inputs(t, e, h, i, k, seed)
    got = moe_call("moe_packed", *args)
    assert torch.equal(got, moe_call("moe", *args))


def test_moe_packed_standard_shapes_thread_invariant_and_token_alone() -> None:
    x, ids, wts, w_gate_up, w_down = _moe_inputs(600, 8, 512, 768, 2, seed=3)
    one = with_threads(1, lambda: cpu.moe(x, ids, wts, w_gate_up, w_down))  # 600 tokens: packed
    two = with_threads(2, lambda: cpu.moe(x, ids, wts, w_gate_up, w_down))
    assert torch.equal(one, two)
    for row in (0, 257, 599):  # one token alone takes the AVX2 kernel
        alone = cpu.moe(x[row : row + 1].contiguous(), ids[row : row + 1].contiguous(),
                        wts[row : row + 1].contiguous(), w_gate_up, w_down)
        assert torch.equal(one[row], alone[0])
    # float64 reference for a few tokens
    for row in (0, 599):
        want = torch.zeros(512, dtype=torch.float64)
        for j in range(2):
            eid = int(ids[row, j])
            gu = w_gate_up[eid].double() @ x[row].double()
            h = torch.nn.functional.silu(gu[:768]) * gu[768:]
            want += float(wts[row, j]) * (w_down[eid].double() @ h)
        torch.testing.assert_close(one[row].double(), want, rtol=1e-4, atol=1e-5)


def test_moe_packed_rejects_out_of_range_ids() -> None:
    x, ids, wts, w_gate_up, w_down = _moe_inputs(100, 4, 16, 8, 2, seed=5)
    ids[50, 1] = 4
    with pytest.raises(ValueError, match=r"expert id outside \[0, 4\)"):
        cpu.moe(x, ids, wts, w_gate_up, w_down)


# bf16 weights (gemm_packed.c's _bf16 entries): each block of weight rows widened once per call,
# then the fp32 kernel, so the result must be linear_bf16 / moe_bf16's bit for bit.


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 80), n=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_linear_packed_bf16_equals_linear_bf16_bitwise(m: int, k: int, n: int, seed: int) -> None:
    x, w = randn(m, k, seed=seed), randn(n, k, seed=seed + 1).bfloat16()  # n > 96: several widened blocks
    got = _linear_call("linear_packed_bf16", x, w)
    assert torch.equal(got, _linear_call("linear_bf16", x, w))
    assert torch.equal(got, _packed(x, w.float()))


@settings(max_examples=30, deadline=None)
@given(t=st.integers(1, 90), e=st.integers(1, 9), h=st.integers(1, 40), i=st.integers(1, 120),
       k=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_moe_packed_bf16_equals_moe_bf16_bitwise(t: int, e: int, h: int, i: int, k: int, seed: int) -> None:
    k = min(k, e)
    x, ids, wts, w_gate_up, w_down = _moe_inputs(t, e, h, i, k, seed)
    args = (x, ids, wts, w_gate_up.bfloat16(), w_down.bfloat16())
    got = moe_call("moe_packed_bf16", *args)
    assert torch.equal(got, moe_call("moe_bf16", *args))
    assert torch.equal(got, moe_call("moe", x, ids, wts, w_gate_up.bfloat16().float(), w_down.bfloat16().float()))


def test_bf16_standard_shapes_thread_invariant_and_row_alone() -> None:
    """The public ``cpu.linear_bf16`` / ``cpu.moe_bf16``: many rows take the packed kernels, one
    row the AVX2 ones; equal bit for bit, on 1 or 2 threads."""
    x, w = randn(300, 512, seed=7), (randn(1536, 512, seed=8) / math.sqrt(512)).bfloat16()
    one = with_threads(1, lambda: cpu.linear_bf16(x, w))
    assert torch.equal(one, with_threads(2, lambda: cpu.linear_bf16(x, w)))
    for row in (0, 151, 299):
        assert torch.equal(one[row], cpu.linear_bf16(x[row : row + 1].contiguous(), w)[0])
    x, ids, wts, w_gate_up, w_down = _moe_inputs(300, 8, 512, 768, 2, seed=9)
    w_gate_up, w_down = w_gate_up.bfloat16(), w_down.bfloat16()
    one = with_threads(1, lambda: cpu.moe_bf16(x, ids, wts, w_gate_up, w_down))
    assert torch.equal(one, with_threads(2, lambda: cpu.moe_bf16(x, ids, wts, w_gate_up, w_down)))
    for row in (0, 299):
        alone = cpu.moe_bf16(x[row : row + 1].contiguous(), ids[row : row + 1].contiguous(),
                             wts[row : row + 1].contiguous(), w_gate_up, w_down)
        assert torch.equal(one[row], alone[0])


@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 17])
@pytest.mark.parametrize("n", [1, 5, 6, 7, 12, 13, 97])
def test_linear_packed_no_k_tail_every_tile_edge_bitwise_and_in_bounds(m: int, n: int) -> None:
    """K a multiple of 8 (no fmaf tail): the tile's lane sums leave the accumulators together,
    two rows x up to 6 columns per masked store. Every row count (odd M: the pair's second row
    missing) and column remainder (N % 6) equals dot_rows bit for bit, and nothing past the
    output is written."""
    k = 64
    x, w = randn(m, k, seed=m), randn(n, k, seed=n + 100)
    buf = torch.full((m * n + 64,), float("nan"))
    ext.lib().linear_packed(x.data_ptr(), w.data_ptr(), buf.data_ptr(), m, k, n)
    assert torch.equal(buf[: m * n].view(m, n), _dot_rows(x, w))
    assert torch.isnan(buf[m * n:]).all()


# The fused path of moe_packed (H and I multiples of 8, k <= 2): SwiGLU as the gate/up product's
# epilogue, h written packed, the weighted combine as the down product's epilogue (a token's first
# slot stores, the second adds). Its outputs land in a NaN-filled tensor, so a row or column that a
# slot never stores stays NaN; the AVX2 kernel (slot by slot, then the combine) is the oracle.


def _routed(t: int, e: int, k: int, seed: int, skew: bool, repeat: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """ids ``[t, k]``: uniform, or skewed (~70 % of the slots on expert 0, some experts idle), and
    with ``repeat`` some tokens naming one expert twice; fp32 weights in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    if skew:
        ids = torch.where(torch.rand(t, k, generator=gen) < 0.7, 0, torch.randint(0, e, (t, k), generator=gen))
    else:
        ids = torch.randint(0, e, (t, k), generator=gen)
    if not repeat and k == 2:  # distinct ids per token unless asked
        ids[:, 1] = torch.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 1) % e, ids[:, 1])
    if repeat and k == 2:
        ids[::7, 1] = ids[::7, 0]
    return ids.contiguous(), torch.rand(t, k, generator=gen)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("t", "e", "h", "i", "k", "skew", "repeat"), [
    (65, 3, 16, 8, 2, False, False),      # odd counts: a pair's second row missing
    (300, 8, 64, 48, 2, True, True),      # skewed, idle experts, one expert named twice by a token
    (257, 5, 40, 104, 1, False, False),   # k = 1; I over one 48-column SwiGLU block, ending short
    (600, 8, 512, 768, 2, False, True),   # the standard MoE's shapes
])
def test_moe_packed_fused_equals_moe_bitwise(threads: int, t: int, e: int, h: int, i: int, k: int, skew: bool,
                                             repeat: bool) -> None:
    x = randn(t, h, seed=t)
    ids, wts = _routed(t, e, k, seed=t + 1, skew=skew, repeat=repeat)
    w_gate_up, w_down = randn(e, 2 * i, h, seed=h) / math.sqrt(h), randn(e, h, i, seed=i) / math.sqrt(i)
    args = (x, ids, wts, w_gate_up, w_down)
    got = with_threads(threads, lambda: moe_call("moe_packed", *args))
    assert torch.equal(got, moe_call("moe", *args))
    bf = (x, ids, wts, w_gate_up.bfloat16(), w_down.bfloat16())
    got_bf16 = with_threads(threads, lambda: moe_call("moe_packed_bf16", *bf))
    assert torch.equal(got_bf16, moe_call("moe_bf16", *bf))
    # float64 reference of one token
    want = torch.zeros(h, dtype=torch.float64)
    for j in range(k):
        eid = int(ids[t - 1, j])
        gu = w_gate_up[eid].double() @ x[t - 1].double()
        want += float(wts[t - 1, j]) * (w_down[eid].double() @ (torch.nn.functional.silu(gu[:i]) * gu[i:]))
    torch.testing.assert_close(got[t - 1].double(), want, rtol=1e-4, atol=1e-5)


def _check_linear_packed_bitwise(threads: int, m: int, k: int, n: int) -> None:
    """``linear_packed`` (fp32 weights) equals dot_rows and ``linear_packed_bf16`` equals
    ``linear_bf16`` bit for bit on ``threads`` threads, neither writing past y."""
    x, w = randn(m, k, seed=m + k), randn(n, k, seed=n) / math.sqrt(k)
    wb = w.bfloat16()
    for fn, weights, want in (("linear_packed", w, _dot_rows(x, w)),
                              ("linear_packed_bf16", wb, _linear_call("linear_bf16", x, wb))):
        buf = torch.full((m * n + 64,), float("nan"))
        call = partial(getattr(ext.lib(), fn), x.data_ptr(), weights.data_ptr(), buf.data_ptr(), m, k, n)
        with_threads(threads, call)
        assert torch.equal(buf[: m * n].view(m, n), want), fn
        assert torch.isnan(buf[m * n:]).all(), fn


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("m", "k", "n"), [(2048, 512, 8), (2047, 512, 8), (301, 77, 32), (301, 77, 33), (9, 64, 1)])
def test_linear_packed_few_weight_rows_split_by_rows_bitwise(threads: int, m: int, k: int, n: int) -> None:
    """Up to 32 weight rows (a router's) the threads split x's row pairs, each packing its own;
    every row (odd M, a K tail) equals dot_rows bit for bit and nothing past y is written."""
    _check_linear_packed_bitwise(threads, m, k, n)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("m", "k", "n"), [(2048, 512, 1024), (2048, 512, 512), (301, 77, 301), (301, 77, 302),
                                           (99, 13, 198), (99, 13, 199), (25, 8, 24)])
def test_linear_packed_split_by_rows_or_columns_bitwise(threads: int, m: int, k: int, n: int) -> None:
    """With w no larger than packed x (fp32: N <= M; bf16 weights: N <= 2M; the prefill's q/k/v and
    o-proj) the threads split x's row pairs, else w's rows; either side of each boundary (odd M, a K
    tail, uneven shares on 3 threads) every row equals dot_rows bit for bit, nothing past y written."""
    _check_linear_packed_bitwise(threads, m, k, n)
