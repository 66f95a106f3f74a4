"""The Triton paged attention kernel against a float64 oracle, under Triton's interpreter.

Spans mix a decode, a fresh prefill, a prefill after a cached prefix (chunked prefill is the
same case: a chunk continues a context) and single-token contexts; block tables are scattered
and non-monotone; GQA groups of 1, 2 and 4; head dims that are and are not powers of two.
"""

from __future__ import annotations

import pytest
import torch

from execstate.kernels.gpu.paged_attention import paged_attention, paged_attention_reference

BS = 4


def _case(nh: int, nkv: int, d: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    tables = torch.tensor([[7, 2, 12, 0], [0, 9, 0, 0], [11, 4, 5, 0], [15, 0, 0, 0], [8, 6, 10, 13]])
    # (sequence, first position, last position + 1) of each span's query rows
    spans = [(0, 9, 10), (1, 0, 5), (2, 4, 7), (3, 0, 1), (4, 12, 13), (2, 7, 9)]
    seqs = [s for s, a, b in spans for _ in range(a, b)]
    pos = [p for _, a, b in spans for p in range(a, b)]
    slots = 16 * BS
    k = torch.randn(slots, nkv, d, generator=g).to(dtype)
    v = torch.randn(slots, nkv, d, generator=g).to(dtype)
    q = torch.randn(len(pos), nh, d, generator=g).to(dtype)
    return q, k, v, torch.tensor(seqs), torch.tensor(pos), tables


@pytest.mark.parametrize(("nh", "nkv", "d"), [(4, 4, 16), (4, 2, 16), (8, 2, 24), (4, 1, 32)])
def test_kernel_matches_float64_reference(nh: int, nkv: int, d: int) -> None:
    q, k, v, seqs, pos, tables = _case(nh, nkv, d, torch.float32, seed=nh * 100 + d)
    scale = d**-0.5
    out = torch.full_like(q, float("nan"))  # every element must be written
    paged_attention(q, k, v, out, seqs, pos, tables, BS, scale)
    ref = paged_attention_reference(q, k, v, seqs, pos, tables, BS, scale)
    assert not out.isnan().any()
    err = (out.double() - ref).norm() / ref.norm()
    assert err < 1e-5, err


def test_bf16_within_bf16_rounding() -> None:
    q, k, v, seqs, pos, tables = _case(8, 2, 16, torch.bfloat16, seed=3)
    out = torch.empty_like(q)
    paged_attention(q, k, v, out, seqs, pos, tables, BS, 0.25)
    ref = paged_attention_reference(q, k, v, seqs, pos, tables, BS, 0.25)
    assert (out.double() - ref).norm() / ref.norm() < 1e-2


def test_a_row_is_the_same_alone_and_in_any_batch() -> None:
    """Batch invariance: each query row computed alone equals, bit for bit, the same row in the
    whole step (and so a prefill row equals the decode of the same token)."""
    q, k, v, seqs, pos, tables = _case(4, 2, 16, torch.float32, seed=7)
    full = torch.empty_like(q)
    paged_attention(q, k, v, full, seqs, pos, tables, BS, 0.25)
    for t in (0, 3, 8, q.shape[0] - 1):
        one = torch.empty_like(q[t : t + 1])
        paged_attention(q[t : t + 1].clone(), k, v, one, seqs[t : t + 1].clone(), pos[t : t + 1].clone(), tables,
                        BS, 0.25)
        assert torch.equal(one[0], full[t])


def test_bad_shapes_are_refused() -> None:
    q, k, v, seqs, pos, tables = _case(4, 2, 16, torch.float32, seed=1)
    with pytest.raises(ValueError, match="do not fit"):
        paged_attention(q[:, :3], k, v, torch.empty_like(q[:, :3]), seqs, pos, tables, BS, 0.25)
    with pytest.raises(ValueError, match="token_seq"):
        paged_attention(q, k, v, torch.empty_like(q), seqs[:-1], pos, tables, BS, 0.25)
    with pytest.raises(ValueError, match="dtype"):
        paged_attention(q.double(), k, v, torch.empty_like(q.double()), seqs, pos, tables, BS, 0.25)
