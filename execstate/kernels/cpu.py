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
    _sync_threads()
    return int(_cpu.max_threads())


def _sync_threads() -> None:
    # OpenMP's thread count is per calling thread and torch applies torch.set_num_threads
    # to each thread lazily (on its first parallel op there). Asking torch applies it now,
    # so a kernel call from a fresh thread (the async engine's) does not run with OpenMP's
    # default instead. ~50 ns.
    torch.get_num_threads()


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
        _sync_threads()
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
        _sync_threads()
        _cpu.moe(x.data_ptr(), ids.data_ptr(), weights.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(),
                 out.data_ptr(), t, ids.shape[1], e, h, i)
    return out


class PagedDecode:
    """Decode attention over a paged KV cache for one step's decode sequences.

    Built once per step from plain lists (validated here, so the per-layer ``run`` only checks
    tensor shapes): for sequence ``b``, its query is row ``tokens[b]`` of the step's flat batch,
    its K/V lie in blocks ``block_tables[b]`` (slot = block * block_size + offset) and it
    attends to its first ``ctx_lens[b]`` positions (at least 1, at most
    ``len(block_tables[b]) * block_size``; block ids below ``num_slots // block_size``).
    """

    def __init__(self, tokens: list[int], block_tables: list[list[int]], ctx_lens: list[int], block_size: int,
                 num_slots: int) -> None:
        if _UNAVAILABLE is not None:
            raise RuntimeError(f"execstate CPU kernels unavailable: {_UNAVAILABLE}")
        if not (len(tokens) == len(block_tables) == len(ctx_lens)) or block_size < 1:
            raise ValueError("PagedDecode: tokens, block_tables and ctx_lens must have one entry per sequence")
        num_blocks = num_slots // block_size
        width = max((len(t) for t in block_tables), default=1)
        for b, (table, n) in enumerate(zip(block_tables, ctx_lens, strict=True)):
            if not 1 <= n <= len(table) * block_size:
                raise ValueError(f"PagedDecode: sequence {b} has ctx_len {n} for {len(table)} blocks of {block_size}")
            if any(not 0 <= blk < num_blocks for blk in table):
                raise ValueError(f"PagedDecode: sequence {b} has a block id outside [0, {num_blocks})")
        if any(t < 0 for t in tokens):
            raise ValueError("PagedDecode: token rows must be >= 0")
        self.num_seqs = len(tokens)
        self.max_token = max(tokens, default=-1)
        self.block_size, self.num_slots = block_size, num_slots
        self.tokens = torch.tensor(tokens, dtype=torch.int64)
        self.ctx_lens = torch.tensor(ctx_lens, dtype=torch.int64)
        self.block_table = torch.zeros((len(tokens), width), dtype=torch.int64)
        for b, table in enumerate(block_tables):
            self.block_table[b, : len(table)] = torch.tensor(table, dtype=torch.int64)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
            scale: float) -> None:
        """``out[tokens[b]] = softmax(q[tokens[b]] K_b^T * scale) V_b`` for every sequence ``b``.

        ``q``/``out`` ``[T, n_heads, d]``, ``k_cache``/``v_cache`` ``[num_slots, n_kv, d]``,
        fp32 contiguous CPU; query head ``j`` reads KV head ``j // (n_heads // n_kv)``.
        """
        for name, t in (("q", q), ("out", out), ("k_cache", k_cache), ("v_cache", v_cache)):
            _require(t, name, 3)
        n, nh, d = q.shape
        slots, nkv, d2 = k_cache.shape
        if out.shape != q.shape or v_cache.shape != k_cache.shape or d2 != d or nh % nkv or slots != self.num_slots:
            raise ValueError(f"PagedDecode: inconsistent shapes q {tuple(q.shape)}, out {tuple(out.shape)}, "
                             f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)} "
                             f"(expected {self.num_slots} slots)")
        if self.max_token >= n:
            raise ValueError(f"PagedDecode: token row {self.max_token} outside a batch of {n}")
        if self.num_seqs:
            assert _cpu is not None
            _sync_threads()
            _cpu.decode_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                                  self.tokens.data_ptr(), self.block_table.data_ptr(), self.ctx_lens.data_ptr(),
                                  self.num_seqs, self.block_table.shape[1], nh, nkv, d, self.block_size,
                                  float(scale))


def _require(t: torch.Tensor, name: str, dim: int) -> None:
    if _cpu is None or _UNAVAILABLE is not None:
        raise RuntimeError(f"execstate CPU kernels unavailable: {_UNAVAILABLE}")
    if not isinstance(t, torch.Tensor) or t.dim() != dim:
        raise ValueError(f"{name} must be a {dim}-D tensor, got {getattr(t, 'shape', type(t))}")
    if not _is_f32_cpu(t):
        raise ValueError(f"{name} must be a contiguous float32 CPU tensor, got {t.dtype} on {t.device}"
                         f"{'' if t.is_contiguous() else ' (non-contiguous)'}")
