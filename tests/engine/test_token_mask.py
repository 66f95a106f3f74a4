"""``apply_token_mask``: the C pass (``kernels/csrc/token_mask.c``) gives the torch path's logits
exactly (the oracle: the unpacked mask and ``masked_fill``), fallback rows included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.engine import token_mask
from execstate.engine.token_mask import TokenMask, apply_token_mask
from execstate.kernels import ext


def _torch_path(x: torch.Tensor, mask: TokenMask, fallback: torch.Tensor | None) -> None:
    lib = ext.LIB
    try:
        ext.LIB = None  # the wrapper's torch branch
        apply_token_mask(x, mask, fallback)
    finally:
        ext.LIB = lib


@pytest.mark.skipif(not ext.available(), reason="CPU kernels unavailable")
@settings(max_examples=40, deadline=None)
@given(vocab=st.integers(1, 200), n=st.integers(1, 6), data=st.data(), with_fallback=st.booleans())
def test_kernel_equals_torch(vocab: int, n: int, data, with_fallback: bool) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    rows = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    words = (vocab + 31) // 32
    bits = torch.from_numpy(rng.integers(-2**31, 2**31, size=(len(rows), words)).astype(np.int32))
    bits[0] = 0  # a row that allows nothing
    x = torch.from_numpy(rng.normal(size=(n, vocab)).astype(np.float32))
    x[rows[-1]] = float("-inf")  # a row whose own bans leave nothing: the fallback decides
    fallback = torch.from_numpy(rng.normal(size=(n, vocab)).astype(np.float32)) if with_fallback else None
    mask = TokenMask(torch.tensor(rows, dtype=torch.long), bits)
    got, want = x.clone(), x.clone()
    assert token_mask._kernel_takes(got, mask, fallback)
    apply_token_mask(got, mask, fallback)
    _torch_path(want, mask, fallback)
    assert torch.equal(got, want)


@pytest.mark.skipif(not ext.available(), reason="CPU kernels unavailable")
def test_kernel_refuses_a_row_outside_the_logits() -> None:
    x = torch.zeros((2, 40))
    with pytest.raises(ValueError, match="outside"):
        apply_token_mask(x, TokenMask(torch.tensor([2]), torch.zeros((1, 2), dtype=torch.int32)))
