"""The grouped GEMM and the row kernels against torch, under Triton's interpreter, and their
batch invariance (a row alone equals the same row in a larger launch, bit for bit)."""

from __future__ import annotations

import pytest
import torch

from execstate.kernels.gpu import grouped_mm as gm
from execstate.kernels.gpu import rows


def _groups(sizes: list[int], k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes), k, generator=g)
    w = torch.randn(len(sizes), n, k, generator=g)
    ends = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    return x, w, ends


@pytest.mark.parametrize("sizes", [[5, 0, 40, 3], [1], [0, 0, 7], [33, 31, 64]])
def test_grouped_mm_matches_per_group_matmul(sizes: list[int]) -> None:
    x, w, ends = _groups(sizes, k=48, n=70, seed=len(sizes))
    out = gm.grouped_mm(x, w, ends)
    ref = torch.cat([x[e - s : e].double() @ w[i].double().T for i, (s, e) in enumerate(zip(sizes, ends.tolist(),
                                                                                             strict=True))])
    assert (out.double() - ref).norm() / ref.norm() < 1e-6


def test_grouped_mm_rows_are_batch_invariant() -> None:
    x, w, ends = _groups([9, 40], k=40, n=24, seed=5)
    full = gm.grouped_mm(x, w, ends)
    for r in (0, 8, 9, 30, 48):
        g = 0 if r < 9 else 1
        one = gm.grouped_mm(x[r : r + 1].clone(), w[g : g + 1], torch.tensor([1], dtype=torch.int32))
        assert torch.equal(one[0], full[r])


def test_linear_matches_torch_and_checks_shapes() -> None:
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(3, 5, 36, generator=g), torch.randn(20, 36, generator=g), torch.randn(20, generator=g)
    assert torch.allclose(gm.linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        gm.grouped_mm(x[0], w[None, :, :10], torch.tensor([5], dtype=torch.int32))
    with pytest.raises(ValueError, match="dtype"):
        gm.grouped_mm(x[0].double(), w[None], torch.tensor([5], dtype=torch.int32))


def test_bf16_grouped_mm_within_bf16_rounding() -> None:
    x, w, ends = _groups([6, 20], k=32, n=16, seed=9)
    out = gm.grouped_mm(x.bfloat16(), w.bfloat16(), ends)
    ref = torch.cat([x[:6] @ w[0].T, x[6:] @ w[1].T])
    assert (out.float() - ref).norm() / ref.norm() < 1e-2


def test_rms_norm_matches_the_model_norm() -> None:
    from execstate.model.layers import RMSNorm

    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 1500, generator=g)  # more than one BLOCK per row
    norm = RMSNorm(1500, 1e-6)
    norm.weight.copy_(torch.randn(1500, generator=g))
    assert torch.allclose(rows.rms_norm(x, norm.weight, 1e-6), norm(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(rows.rms_norm(x[3:4].clone(), norm.weight, 1e-6)[0], rows.rms_norm(x, norm.weight, 1e-6)[3])


@pytest.mark.parametrize("log", [False, True])
def test_softmax_matches_torch(log: bool) -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 2100, generator=g) * 4
    x[1, :2000] = float("-inf")  # a row whose first chunks are all masked
    ref = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
    out = rows.softmax(x, log=log)
    finite = ref.isfinite()
    assert torch.equal(finite, out.isfinite())
    assert torch.allclose(out[finite], ref[finite], rtol=1e-5, atol=1e-6)
    assert torch.equal(rows.softmax(x[2:3].clone(), log=log)[0], out[2])
