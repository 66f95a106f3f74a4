"""Fixtures of the kernel tests: one intra-op thread per test (restored after), and a skip
where the kernels are unavailable, except for tests marked ``kernels_optional`` (they
decide themselves whether unavailability is allowed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from execstate.kernels import cpu


@pytest.fixture(autouse=True)
def _kernels_one_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """One intra-op thread by default (a loaded 2-core box makes tiny 2-thread calls slow);
    tests that compare thread counts switch explicitly."""
    if not cpu.available() and request.node.get_closest_marker("kernels_optional") is None:
        pytest.skip(f"kernels unavailable: {cpu.unavailable_reason()}")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
