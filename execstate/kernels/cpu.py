"""Python face of the C kernels in ``_cpu.c``: small-batch fp32 linear and the fused MoE block.

``available()`` is True when the extension was built (it is optional: no compiler, no
kernels) and the CPU has AVX2 and FMA. The functions check every tensor they hand to C
(device, dtype, shape, contiguity) and raise ``ValueError`` naming the problem: the C side
trusts raw pointers. Use ``use_linear``/``use_moe`` to decide whether a call should take
the kernel path; otherwise use torch.

Numerics (see ``_cpu.c``): deterministic and batch-invariant; not bitwise equal to torch's
MKL path. The engine records ``KERNEL_SET`` in its provenance numerics when it uses them.
"""

from __future__ import annotations

import torch  # imported before _cpu so the extension binds to torch's OpenMP runtime

try:
    from execstate.kernels import _cpu  # type: ignore[attr-defined]

    _UNAVAILABLE: str | None = None if _cpu.available() else "this CPU lacks AVX2/FMA"
except ImportError as exc:  # built without a C compiler
    _cpu = None
    _UNAVAILABLE = f"extension not built ({exc})"

KERNEL_SET = "cpu-avx2-v1"
# Rows up to which the streaming kernel beats torch's GEMM (measured: execstate bench kernels).
MAX_LINEAR_ROWS = 16
# Tokens up to which the fused MoE kernel is used (each expert then sees few rows).
MAX_MOE_TOKENS = 16


def available() -> bool:
    return _UNAVAILABLE is None


def unavailable_reason() -> str | None:
    return _UNAVAILABLE


def max_threads() -> int:
    """Threads the kernels' OpenMP runtime uses (torch's, so ``torch.get_num_threads()``)."""
    if _cpu is None:
        raise RuntimeError(f"execstate CPU kernels unavailable: {_UNAVAILABLE}")
    return int(_cpu.max_threads())


def _is_f32_cpu(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()


def use_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear(x, weight)`` applies and is the faster path (few rows, fp32, CPU)."""
    return (
        _UNAVAILABLE is None
        and x.dim() == 2
        and x.shape[0] <= MAX_LINEAR_ROWS
        and _is_f32_cpu(x)
        and _is_f32_cpu(weight)
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
    )


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T`` -> new ``[M, N]``; fp32 CPU contiguous tensors only."""
    _require(x, "x", 2)
    _require(weight, "weight", 2)
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: x has {x.shape[1]} features, weight expects {weight.shape[1]}")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=torch.float32)
    if m and n:
        assert _cpu is not None
        _cpu.linear(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, k, n)
    return y


def use_moe(x: torch.Tensor, w_gate_up: torch.Tensor) -> bool:
    """Whether the fused MoE kernel applies (fp32 CPU, at most ``MAX_MOE_TOKENS`` tokens)."""
    return _UNAVAILABLE is None and x.dim() == 2 and x.shape[0] <= MAX_MOE_TOKENS \
        and _is_f32_cpu(x) and _is_f32_cpu(w_gate_up)


def moe(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
        w_down: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))``, ``e = ids[t, j]``.

    ``x [T, H]``, ``ids`` int64 ``[T, k]`` (each in ``[0, E)``, else ``ValueError``),
    ``weights`` fp32 ``[T, k]``, ``w_gate_up [E, 2I, H]`` (gate rows first),
    ``w_down [E, H, I]``. Per-token slot results are summed over ``j`` in order.
    """
    _require(x, "x", 2)
    _require(weights, "weights", 2)
    _require(w_gate_up, "w_gate_up", 3)
    _require(w_down, "w_down", 3)
    if ids.dtype != torch.int64 or ids.device.type != "cpu" or not ids.is_contiguous() or ids.dim() != 2:
        raise ValueError(f"moe: ids must be contiguous int64 [T, k] on CPU, got {ids.dtype} {tuple(ids.shape)}")
    t, h = x.shape
    e, two_i, h2 = w_gate_up.shape
    i = two_i // 2
    if h2 != h or two_i % 2 or tuple(w_down.shape) != (e, h, i):
        raise ValueError(f"moe: inconsistent shapes x {tuple(x.shape)}, w_gate_up {tuple(w_gate_up.shape)}, "
                         f"w_down {tuple(w_down.shape)}")
    if ids.shape[0] != t or tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(f"moe: ids {tuple(ids.shape)} and weights {tuple(weights.shape)} must both be [{t}, k]")
    out = torch.empty((t, h), dtype=torch.float32)
    if t:
        assert _cpu is not None
        _cpu.moe(x.data_ptr(), ids.data_ptr(), weights.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(),
                 out.data_ptr(), t, ids.shape[1], e, h, i)
    return out


def _require(t: torch.Tensor, name: str, dim: int) -> None:
    if _cpu is None or _UNAVAILABLE is not None:
        raise RuntimeError(f"execstate CPU kernels unavailable: {_UNAVAILABLE}")
    if not isinstance(t, torch.Tensor) or t.dim() != dim:
        raise ValueError(f"{name} must be a {dim}-D tensor, got {getattr(t, 'shape', type(t))}")
    if not _is_f32_cpu(t):
        raise ValueError(f"{name} must be a contiguous float32 CPU tensor, got {t.dtype} on {t.device}"
                         f"{'' if t.is_contiguous() else ' (non-contiguous)'}")
