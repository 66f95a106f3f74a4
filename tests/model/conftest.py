"""Model tests run torch single-threaded.

The models here are tiny; with 2 intra-op threads on a loaded 2-core machine every small
GEMM waits for a second thread to be scheduled (measured: 25 ms instead of 10 us per
linear). One thread makes the suite fast and its timings stable. Restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
