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
def _thp_eligible(t: torch.Tensor) -> bool:
    """Whether the kernel marks the mapping holding ``t``'s data eligible for huge pages
    (``THPeligible: 1`` in ``/proc/self/smaps``: what ``MADV_HUGEPAGE`` changes)."""
    lo, inside = t.data_ptr(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a <= lo < b
            elif inside and head == "THPeligible:":
                return line.split()[1] == "1"
    return False


def test_the_data_is_marked_for_huge_pages() -> None:
    """The mapping is marked eligible; whether the first write then gets huge pages is the
    kernel's (free, unfragmented memory: a whole-suite CI run here got none, a lone run 16 MiB), so
    the pages mapped are printed, not asserted."""
    if not _thp_madvise_allowed():
        pytest.skip("transparent huge pages off on this host")
    t = empty_huge((8 * HUGE_PAGE // 4,), torch.float32)  # 16 MiB
    t.fill_(1.0)
    assert t.data_ptr() % HUGE_PAGE == 0
    assert _thp_eligible(t)
    print(f"huge pages mapped: {huge_page_kib(t)} KiB of {t.nbytes // 1024}")


def test_small_and_off_cpu_tensors_are_plain() -> None:
    small = empty_huge((1024,), torch.bfloat16)
    assert small.shape == (1024,) and small.dtype == torch.bfloat16
    assert small.untyped_storage().nbytes() == small.nbytes
    meta = empty_huge((4096, 1024), torch.float32, device="meta")
    assert meta.device.type == "meta" and meta.shape == (4096, 1024)
