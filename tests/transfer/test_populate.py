"""``populate``: maps a receiver pool's pages ahead without changing their contents."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from execstate.transfer.bulk import populate


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_populate_maps_pages_and_keeps_contents():
    lazy = np.zeros(64 << 20, dtype=np.uint8)  # calloc: pages not mapped until written
    lazy[12345] = 7  # one page written by "the engine"
    before = rss_bytes()
    if not populate(lazy.ctypes.data, lazy.nbytes, chunk=8 << 20):
        pytest.skip("kernel without MADV_POPULATE_WRITE (< 5.14)")
    assert rss_bytes() - before > 60 << 20
    assert lazy[12345] == 7 and int(lazy.sum()) == 7
