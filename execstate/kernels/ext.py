"""Loads the C extension ``_cpu`` and holds what every kernel wrapper shares.

``available()`` is True when the extension was built (it is optional: no compiler, no
kernels) and the CPU has AVX2 and FMA. Wrappers check every tensor they hand to C with
``require`` (device, dtype, shape, contiguity) and raise ``ValueError`` naming the problem:
the C side trusts raw pointers. They call ``sync_threads()`` before C runs.
"""

from __future__ import annotations

from typing import Any

import torch  # imported before _cpu so the extension binds to torch's OpenMP runtime

try:
    from execstate.kernels import _cpu  # type: ignore[attr-defined]  # the C extension: no stub, held as Any

    _UNAVAILABLE: str | None = None if _cpu.available() else "this CPU lacks AVX2/FMA"
except ImportError as exc:  # built without a C compiler
    _cpu = None
    _UNAVAILABLE = f"extension not built ({exc})"

# v2: MoE routing in the kernels' own order (kernels/routing.py), shared by prefill and decode
KERNEL_SET = "cpu-avx2-v2"
# The extension when usable, else None: hot paths test this constant instead of calling.
LIB: Any = _cpu if _UNAVAILABLE is None else None
F32 = torch.float32


def available() -> bool:
    return _UNAVAILABLE is None


def unavailable_reason() -> str | None:
    return _UNAVAILABLE


def max_threads() -> int:
    """Threads the kernels' OpenMP runtime uses (torch's, so ``torch.get_num_threads()``)."""
    if _cpu is None:
        raise RuntimeError(f"execstate CPU kernels unavailable: {_UNAVAILABLE}")
    sync_threads()
    return int(_cpu.max_threads())


def sync_threads() -> None:
    # OpenMP's thread count is per calling thread and torch applies torch.set_num_threads
    # to each thread lazily (on its first parallel op there). Asking torch applies it now,
    # so a kernel call from a fresh thread (the async engine's) does not run with OpenMP's
    # default instead. ~50 ns.
    torch.get_num_threads()


def is_f32_cpu(t: torch.Tensor) -> bool:
    return t.dtype is F32 and t.is_cpu and t.is_contiguous()  # is_cpu: no torch.device object


def lib() -> Any:
    """The loaded extension module; ``RuntimeError`` when the kernels are unavailable."""
    if _cpu is None or _UNAVAILABLE is not None:
        raise RuntimeError(f"execstate CPU kernels unavailable: {_UNAVAILABLE}")
    return _cpu


def require(t: torch.Tensor, name: str, dim: int, dtype: torch.dtype = F32) -> None:
    """``RuntimeError`` without the kernels; ``ValueError`` unless ``t`` is a contiguous ``dim``-D
    ``dtype`` CPU tensor."""
    if _cpu is None or _UNAVAILABLE is not None:
        raise RuntimeError(f"execstate CPU kernels unavailable: {_UNAVAILABLE}")
    if not isinstance(t, torch.Tensor) or t.dim() != dim:
        raise ValueError(f"{name} must be a {dim}-D tensor, got {getattr(t, 'shape', type(t))}")
    if not (t.dtype is dtype and t.is_cpu and t.is_contiguous()):
        raise ValueError(f"{name} must be a contiguous {str(dtype).removeprefix('torch.')} CPU tensor, got {t.dtype} "
                         f"on {t.device}{'' if t.is_contiguous() else ' (non-contiguous)'}")
