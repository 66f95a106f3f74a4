"""Helpers shared by the kernel tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from execstate.kernels import cpu, ext

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


def moe_call(name: str, x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, w_gate_up: torch.Tensor,
             w_down: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The C MoE entry ``name`` (``moe``, ``moe_packed``, ``moe_bf16``, ...) called directly, into
    ``out`` (a NaN-filled new tensor by default: nothing on the Python side allocates then)."""
    out = torch.full_like(x, float("nan")) if out is None else out
    e, two_i, h = w_gate_up.shape
    getattr(ext.lib(), name)(x.data_ptr(), ids.data_ptr(), wts.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(),
                             out.data_ptr(), x.shape[0], ids.shape[1], e, h, two_i // 2)
    return out


def linear_call(name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The C linear entry ``name`` (``linear``, ``linear_bf16dot_emu``, ...) called directly, into a
    NaN-filled new output."""
    y = torch.full((x.shape[0], w.shape[0]), float("nan"))
    getattr(ext.lib(), name)(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], w.shape[0])
    return y
