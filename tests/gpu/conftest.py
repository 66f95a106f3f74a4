"""The GPU path's tests run on the CPU: Triton kernels under Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before a kernel module is imported (``triton.jit`` decides
at decoration time), so it is set here, when pytest collects this directory, and the kernel
modules are imported by the tests only (the engine imports them on a CUDA device only).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _single_thread(torch_single_thread: None) -> None:
    """The models here are tiny: one torch thread (tests/conftest.py)."""
