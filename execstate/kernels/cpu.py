"""execstate's CPU kernels, one import for the model: ``from execstate.kernels import cpu``.

- ``ext``: the optional C extension ``_cpu`` (sources in ``csrc/``) (AVX2/FMA, OpenMP on torch's thread pool):
  ``available()``, ``unavailable_reason()``, ``max_threads()``, ``KERNEL_SET``;
- ``gemm``: few-row fp32 linear and the fused MoE expert block; on AVX-512 CPUs (``PACKED``) also
  many-row (prefill) calls, on the register-blocked kernels of ``csrc/gemm_packed.c`` (same bits);
- ``gemm_bf16``: the same two with bf16 weights (fp32 activations and sums), ``KERNEL_SET_BF16``;
- ``paged_decode``: decode attention on the paged cache's block tables;
- ``fused``: RMSNorm, q/k/v split + QK-norm + RoPE (or with k/v stored straight into the KV cache), SwiGLU gate;
- ``linear_epilogue``: the prefill's q/k/v projection with that split, QK-norm, RoPE and K/V store as its
  epilogue, and the o-proj with the residual add and the next RMSNorm as its.

Call sites go through this module's attributes (``cpu.linear(...)``), so one place decides
what runs. Numerics: deterministic and batch-invariant, not bitwise equal to torch's; the
engine records ``KERNEL_SET`` in its provenance numerics when it uses them.
"""

from execstate.kernels.ext import KERNEL_SET, available, max_threads, unavailable_reason
from execstate.kernels.fused import add_rms_norm, qkv_rope, qkv_rope_to_cache, rms_norm, sigmoid, silu_mul, use_rows
from execstate.kernels.gemm import (
    MAX_LINEAR_ROWS,
    MAX_MOE_TOKENS,
    MIN_PACKED_ROWS,
    PACKED,
    linear,
    linear_if_small,
    moe,
    use_linear,
    use_moe,
)
from execstate.kernels.gemm_bf16 import (
    KERNEL_SET_BF16,
    MAX_LINEAR_ROWS_BF16,
    linear_bf16,
    linear_bf16_if_small,
    moe_bf16,
    use_linear_bf16,
    use_moe_bf16,
)
from execstate.kernels.linear_epilogue import linear_add_rms_norm, linear_qkv_rope_to_cache, use_linear_epilogue
from execstate.kernels.paged_decode import PagedDecode

__all__ = [
    "add_rms_norm",
    "KERNEL_SET",
    "MAX_LINEAR_ROWS",
    "MAX_MOE_TOKENS",
    "MIN_PACKED_ROWS",
    "PACKED",
    "PagedDecode",
    "available",
    "linear",
    "linear_add_rms_norm",
    "linear_if_small",
    "linear_qkv_rope_to_cache",
    "max_threads",
    "moe",
    "qkv_rope",
    "qkv_rope_to_cache",
    "rms_norm",
    "sigmoid",
    "silu_mul",
    "unavailable_reason",
    "use_linear",
    "use_linear_epilogue",
    "use_moe",
    "use_rows",
    "KERNEL_SET_BF16",
    "MAX_LINEAR_ROWS_BF16",
    "linear_bf16",
    "linear_bf16_if_small",
    "moe_bf16",
    "use_linear_bf16",
    "use_moe_bf16",
]
