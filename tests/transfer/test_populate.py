"""``populate``: maps a receiver pool's pages ahead without changing their contents."""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import pytest

from execstate.transfer.bulk import populate


def resident_pages(addr: int, nbytes: int) -> tuple[int, int]:
    """(resident, total) pages of the page-aligned interior of a range (``mincore``)."""
    page = mmap.PAGESIZE
    start = (addr + page - 1) // page * page
    n = ((addr + nbytes) // page * page - start) // page
    vec = (ctypes.c_ubyte * n)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(start, n * page, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec), n


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_populate_maps_pages_and_keeps_contents():
    region = mmap.mmap(-1, 64 << 20)  # fresh anonymous memory: pages mapped on first write
    lazy = np.frombuffer(region, dtype=np.uint8)
    addr = lazy.ctypes.data
    lazy[12345] = 7  # one page written by "the engine"
    resident, total = resident_pages(addr, lazy.nbytes)
    assert resident < total // 2
    if not populate(addr, lazy.nbytes, chunk=8 << 20):
        pytest.skip("kernel without MADV_POPULATE_WRITE (< 5.14)")
    assert resident_pages(addr, lazy.nbytes) == (total, total)
    assert lazy[12345] == 7 and int(lazy.sum()) == 7
    del lazy
