"""The bf16-weight kernels (``linear_bf16``, ``moe_bf16``: csrc/gemm_bf16.c).

Oracles: float64 references on the widened weights; the fp32 kernels on ``w.float()``, which
the contract says the bf16 kernels equal bit for bit (same FMA sequence on exactly widened
weights); bitwise batch invariance (a row alone equals the same row in any batch, any
position, one or two threads), which also checks the AVX-512 few-row kernel
(``gemm_bf16_pairs.c``, calls of 4+ rows) against the AVX2 one (a row alone), bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import randn, with_threads

from execstate.kernels import cpu


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return (randn(*shape, seed=seed) * 0.5).to(torch.bfloat16)


def _route(t: int, k: int, e: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]) if t else torch.empty(0, k)
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=-1)
    return ids.long().contiguous(), weights.contiguous()


def test_widening_is_exact_for_every_bf16_bit_pattern() -> None:
    """All 65536 bf16 values (NaNs, infinities, subnormals) widen exactly: a 1x1 linear with
    x = 1 returns each weight as fp32 (x = 1 makes the product exact; the sum starts at +0, so
    -0 comes back as +0, as in the fp32 kernel)."""
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    w = bits.view(torch.bfloat16).reshape(-1, 1).contiguous()
    y = cpu.linear_bf16(torch.ones(1, 1), w)[0]
    want = w.float()[:, 0]
    same_bits = y.view(torch.int32) == want.view(torch.int32)
    assert (same_bits | want.isnan()).sum().item() == 65535 and not same_bits[32768]  # all but -0
    assert y[32768].item() == 0.0
    assert torch.equal(y.view(torch.int32), cpu.linear(torch.ones(1, 1), w.float())[0].view(torch.int32))
    assert y.isnan().sum().item() == want.isnan().sum().item() == 254


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 40), k=st.integers(1, 70), n=st.integers(0, 21), seed=st.integers(0, 2**16))
def test_linear_bf16_equals_fp32_kernel_on_widened_weights(m: int, k: int, n: int, seed: int) -> None:
    x, w = randn(m, k, seed=seed), _bf16(n, k, seed=seed + 1)
    y = cpu.linear_bf16(x, w)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert torch.equal(y, cpu.linear(x, w.float()))
    ref = x.double() @ w.double().T
    if ref.numel():
        assert (y.double() - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())


def test_linear_bf16_parallel_sizes_match_fp32_kernel() -> None:
    """Above the parallel threshold, two threads split the weight rows: same bits as one."""
    x, w = randn(9, 515, seed=3), _bf16(1029, 515, seed=4)
    one = with_threads(1, lambda: cpu.linear_bf16(x, w))
    two = with_threads(2, lambda: cpu.linear_bf16(x, w))
    assert torch.equal(one, two) and torch.equal(one, cpu.linear(x, w.float()))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("k", "n"), [(512, 1536), (77, 45)])
def test_linear_bf16_is_batch_invariant_bitwise(k: int, n: int, threads: int) -> None:
    x, w = randn(32, k, seed=k), _bf16(n, k, seed=n)
    alone = torch.cat([cpu.linear_bf16(x[i : i + 1], w) for i in range(32)])
    for m in (2, 3, 4, 5, 8, 13, 32):
        for start in (0, 7):
            rows = (torch.arange(m) + start) % 32
            out = with_threads(threads, lambda rows=rows: cpu.linear_bf16(x[rows].contiguous(), w))
            assert torch.equal(out, alone[rows]), f"M={m} start={start}: a row depends on its batch"


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize(("h", "inter"), [(37, 13), (64, 48)])
def test_moe_bf16_equals_fp32_kernel_on_widened_weights(top_k: int, h: int, inter: int) -> None:
    e = 8
    w_gate_up, w_down = _bf16(e, 2 * inter, h, seed=h), _bf16(e, h, inter, seed=inter)
    x = randn(16, h, seed=top_k)
    for t in (0, 1, 2, 5, 16):
        ids, weights = _route(t, top_k, e, seed=t)
        xt = x[:t].contiguous()
        out = cpu.moe_bf16(xt, ids, weights, w_gate_up, w_down)
        assert out.shape == (t, h) and out.dtype == torch.float32
        assert torch.equal(out, cpu.moe(xt, ids, weights, w_gate_up.float(), w_down.float()))
        # and the float64 oracle: per token, per slot, on the widened weights
        for i in range(t):
            ref = torch.zeros(h, dtype=torch.float64)
            for j in range(top_k):
                ex = int(ids[i, j])
                gu = w_gate_up[ex].double() @ xt[i].double()
                act = torch.nn.functional.silu(gu[:inter]) * gu[inter:]
                ref += float(weights[i, j]) * (w_down[ex].double() @ act)
            assert (out[i].double() - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("threads", [1, 2])
def test_moe_bf16_is_batch_invariant_bitwise(threads: int) -> None:
    e, h, inter = 8, 128, 96
    w_gate_up, w_down = _bf16(e, 2 * inter, h, seed=1), _bf16(e, h, inter, seed=2)
    x = randn(16, h, seed=3)
    ids, weights = _route(16, 2, 7, seed=4)  # 7 of 8 experts: 2 threads split inside an expert
    alone = torch.cat([cpu.moe_bf16(x[t : t + 1], ids[t : t + 1], weights[t : t + 1], w_gate_up, w_down)
                       for t in range(16)])
    for t_count in (2, 3, 7, 16):
        for start in (0, 9):
            rows = (torch.arange(t_count) + start) % 16
            out = with_threads(threads, lambda rows=rows: cpu.moe_bf16(
                x[rows].contiguous(), ids[rows].contiguous(), weights[rows].contiguous(), w_gate_up, w_down))
            assert torch.equal(out, alone[rows]), f"T={t_count} start={start}: a token depends on its batch"


def test_bf16_kernels_are_chosen_only_for_their_inputs() -> None:
    x, w = randn(4, 64, seed=1), _bf16(32, 64, seed=2)
    assert cpu.use_linear_bf16(x, w) and cpu.linear_bf16_if_small(x, w) is not None
    assert not cpu.use_linear_bf16(x, w.float()) and not cpu.use_linear(x, w)
    # many rows: the packed kernels where the CPU has AVX-512, else torch
    assert cpu.use_linear_bf16(randn(cpu.MAX_LINEAR_ROWS_BF16 + 1, 64, seed=3), w) == cpu.PACKED
    assert not cpu.use_linear_bf16(x.bfloat16(), w)
    assert cpu.linear_bf16_if_small(x[:, :32], w[:, :32]) is None  # non-contiguous views
    wgu = _bf16(4, 16, 64, seed=5)
    assert cpu.use_moe_bf16(x, wgu) and not cpu.use_moe_bf16(x, wgu.float()) and not cpu.use_moe(x, wgu)
    assert cpu.use_moe_bf16(randn(cpu.MAX_MOE_TOKENS + 1, 64, seed=6), wgu) == cpu.PACKED


def test_bf16_kernels_bad_input_names_the_problem() -> None:
    x, w = randn(2, 16, seed=1), _bf16(8, 16, seed=2)
    with pytest.raises(ValueError, match="weight must be a contiguous bfloat16"):
        cpu.linear_bf16(x, w.float())
    with pytest.raises(ValueError, match="x must be a contiguous float32"):
        cpu.linear_bf16(x.bfloat16(), w)
    with pytest.raises(ValueError, match="x has 15 features, weight expects 16"):
        cpu.linear_bf16(x[:, :15].contiguous(), w)
    wgu, wd = _bf16(4, 8, 16, seed=3), _bf16(4, 16, 4, seed=4)
    ids, wts = _route(2, 2, 4, seed=5)
    with pytest.raises(ValueError, match="w_down must be a contiguous bfloat16"):
        cpu.moe_bf16(x, ids, wts, wgu, wd.float())
    with pytest.raises(ValueError, match="inconsistent shapes"):
        cpu.moe_bf16(x, ids, wts, wgu, _bf16(4, 16, 5, seed=6))
    with pytest.raises(ValueError, match=r"expert id outside \[0, 4\)"):
        cpu.moe_bf16(x, torch.tensor([[0, 4], [1, 2]]), wts, wgu, wd)


def _rows_alone(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn`` on each row of ``x`` alone: one row takes the AVX2 kernel, never the pairs one."""
    return torch.cat([fn(x[r : r + 1].contiguous()) for r in range(x.shape[0])])


@pytest.mark.skipif(not cpu.PACKED, reason="no AVX-512 here: the pairs kernel does not run")
@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 32), k=st.integers(1, 300), n=st.integers(1, 70), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_pairs_kernel_equals_avx2_kernel_bitwise(m: int, k: int, n: int, threads: int, seed: int) -> None:
    """Every tile edge: odd M (a missing pair row), N % 4, K % 8 tails, several pair passes.
    Oracles: each row alone (the AVX2 kernel) and the fp32 kernels on the widened weights."""
    x, w = randn(m, k, seed=seed), _bf16(n, k, seed=seed + 1)
    got = with_threads(threads, lambda: cpu.linear_bf16(x, w))
    assert torch.equal(got, _rows_alone(lambda row: cpu.linear_bf16(row, w), x))
    assert torch.equal(got, cpu.linear(x, w.float()))


@pytest.mark.skipif(not cpu.PACKED, reason="no AVX-512 here: the pairs kernel does not run")
def test_pairs_kernel_in_moe_and_standard_shapes() -> None:
    """The fused MoE block (experts of 4+ tokens take the pairs kernel) and the standard model's
    LM head shape at batch 8: equal to each token alone (the AVX2 kernel) and to the fp32 kernels
    on the widened weights, bit for bit."""
    h, i = 512, 768
    w_gate_up, w_down = _bf16(8, 2 * i, h, seed=1) / 20, _bf16(8, h, i, seed=2) / 30
    x = randn(32, h, seed=3)
    ids, weights = _route(32, 2, 8, seed=4)
    got = cpu.moe_bf16(x, ids, weights, w_gate_up, w_down)
    alone = torch.cat([cpu.moe_bf16(x[t : t + 1], ids[t : t + 1], weights[t : t + 1], w_gate_up, w_down)
                       for t in range(32)])
    assert torch.equal(got, alone)
    assert torch.equal(got, cpu.moe(x, ids, weights, w_gate_up.float(), w_down.float()))
    head = _bf16(32000, h, seed=5)
    got = cpu.linear_bf16(x[:8].contiguous(), head)
    assert torch.equal(got, _rows_alone(lambda row: cpu.linear_bf16(row, head), x[:8]))
    assert torch.equal(got, cpu.linear(x[:8].contiguous(), head.float()))
