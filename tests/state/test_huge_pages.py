"""Weights on 2 MiB-aligned huge pages (``state/huge_pages.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from execstate.state.huge_pages import HUGE_PAGE, empty_huge, huge_page_kib


def _thp_madvise_allowed() -> bool:
    p = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return p.exists() and "[never]" not in p.read_text()


def test_large_tensor_is_2mib_aligned_and_holds_its_values() -> None:
    shape = (2500, 512)  # 5,120,000 bytes: two whole huge pages and a 4 KiB tail
    t = empty_huge(shape, torch.float32)
    assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    src = torch.arange(2500 * 512, dtype=torch.float32).reshape(shape)
    t.copy_(src)
    assert torch.equal(t, src)
    assert t.untyped_storage().nbytes() == t.nbytes + HUGE_PAGE  # one private buffer, 2 MiB over


@pytest.mark.skipif(not _thp_madvise_allowed(), reason="transparent huge pages are off on this host")
def test_first_write_maps_huge_pages() -> None:
    t = empty_huge((8 * HUGE_PAGE // 4,), torch.float32)  # 16 MiB
    t.fill_(1.0)
    assert huge_page_kib(t) >= 2048  # at least one 2 MiB page (the host may lack free huge pages for all)


def test_small_and_off_cpu_tensors_are_plain() -> None:
    small = empty_huge((1024,), torch.bfloat16)
    assert small.shape == (1024,) and small.dtype == torch.bfloat16
    assert small.untyped_storage().nbytes() == small.nbytes
    meta = empty_huge((4096, 1024), torch.float32, device="meta")
    assert meta.device.type == "meta" and meta.shape == (4096, 1024)
