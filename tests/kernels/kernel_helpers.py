"""Helpers shared by the kernel tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from execstate.kernels import cpu

T = TypeVar("T")


def randn(*shape: int, seed: int) -> torch.Tensor:
    """Seeded standard-normal fp32 tensor (independent of the global RNG)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def with_threads(n: int, fn: Callable[[], T]) -> T:
    """``fn()`` with ``n`` intra-op threads (checked on the kernels' side), then the previous
    thread count back."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        assert cpu.max_threads() == n
        return fn()
    finally:
        torch.set_num_threads(before)
