"""Dense building blocks: RMSNorm, gated MLP, attention.

All modules take a flat token batch ``[T, hidden]`` (no batch dimension). Numerics follow
the HF reference implementations op for op (RMSNorm in fp32 then cast back, cos/sin cast
to the model dtype before rotating), so fp32 results match transformers to ~1e-6 and bf16
results to bf16 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from execstate.kernels import cpu as cpu_kernels
from execstate.kernels import formats
from execstate.kernels.weight_format import WeightFormat
from execstate.model.bf16_weights import BF16, linear_mixed
from execstate.model.config import ModelConfig
from execstate.model.context import StepContext
from execstate.model.paged_attention import PagedAttention
from execstate.model.rotary import RotaryEmbedding


class Linear(nn.Linear):
    """``nn.Linear`` that takes execstate's CPU kernel for few-row fp32 inputs when enabled.

    ``use_kernels`` (off by default; ``CausalLM.use_cpu_kernels`` sets it) routes calls that
    ``cpu_kernels.use_linear`` accepts to the kernel (``linear_if_small``; bias added
    after); every other call is ``F.linear``. The two paths agree to fp32 rounding, not bitwise.
    A bf16 weight with fp32 input (``model/bf16_weights.py``) takes ``linear_bf16_if_small`` or
    ``linear_mixed``. A ``weight_format`` (bf16 arithmetic, GGUF blocks: ``model/weight_formats.py``)
    takes that format's kernel for every call.
    """

    use_kernels: bool = False
    weight_format: WeightFormat | None = None  # a kernel format of its own (model/weight_formats.py)
    batch_invariant: bool = False  # the deterministic GPU mode's matmul (model/gpu_path.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_invariant:
            from execstate.kernels.gpu.grouped_mm import linear

            return linear(x, self.weight, self.bias)
        if self.weight_format is not None:  # bf16 arithmetic, GGUF blocks: always the format's kernel
            y = formats.linear(x, self.weight, self.weight_format)
            return y if self.bias is None else y.add_(self.bias)
        if self.use_kernels:
            w = self.weight
            fast = cpu_kernels.linear_if_small(x, w) if w.dtype is not BF16 else cpu_kernels.linear_bf16_if_small(x, w)
            if fast is not None:
                return fast if self.bias is None else fast.add_(self.bias)
        if self.weight.dtype is not x.dtype:  # bf16 weights, fp32 activations (model/bf16_weights.py)
            return linear_mixed(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """``weight * (x / rms(x))`` over the last dim, computed in fp32, returned in ``x.dtype``."""

    use_kernels: bool = False  # fused C kernel for 2-D fp32 rows (CausalLM.use_cpu_kernels)
    batch_invariant: bool = False  # the deterministic GPU mode's row kernel (model/gpu_path.py)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_invariant:
            from execstate.kernels.gpu.rows import rms_norm

            return rms_norm(x, self.weight, self.eps)
        if self.use_kernels and cpu_kernels.use_rows(x):
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class GatedMLP(nn.Module):
    """SwiGLU MLP ``down(silu(gate(x)) * up(x))`` with gate and up fused in one matmul.

    ``gate_up_proj.weight`` is ``[2I, H]``: rows ``[0, I)`` are the gate, ``[I, 2I)`` the up
    projection (the layout of HF's fused expert tensors).
    """

    use_kernels: bool = False  # fused SwiGLU gate in C (CausalLM.use_cpu_kernels)

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.use_kernels and cpu_kernels.use_rows(gate_up):
            return self.down_proj(cpu_kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Attention(nn.Module):
    """Self-attention of one decoder layer with fused q/k/v projection and GQA.

    ``forward(x, cos, sin, ctx)``: projects ``x`` ``[T, H]`` with ``qkv_proj`` (weight
    ``[(n_heads + 2 * n_kv_heads) * head_dim, H]``, rows q | k | v), applies QK-norm and
    ``clip_qkv`` where the architecture has them, RoPE, then hands
    ``q [T, n_heads, head_dim]`` and ``k, v [T, n_kv_heads, head_dim]`` (contiguous, model
    dtype) to ``ctx.attention.forward(layer_idx, q, k, v)`` and projects its output back.
    """

    use_kernels: bool = False  # fused split + QK-norm + RoPE in C (CausalLM.use_cpu_kernels)

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        qkv_size = self.q_size + 2 * self.kv_size
        self.qkv_proj = Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.attention_out_bias)
        self.per_head_norm = config.qk_norm_per_head
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            per_head = (self.head_dim, self.head_dim)
            q_dim, k_dim = per_head if self.per_head_norm else (self.q_size, self.kv_size)
            self.q_norm = RMSNorm(q_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(k_dim, config.rms_norm_eps)
        self.clip_qkv = config.clip_qkv
        self.eps = config.rms_norm_eps

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ctx: StepContext) -> torch.Tensor:
        return self.o_proj(self.attend(x, cos, sin, ctx))

    def attend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``forward`` without the output projection: the attention's output ``[T, n_heads * head_dim]``."""
        n = x.shape[0]
        fused = self._fused_projection(x, cos, sin, ctx)
        if fused is not None:
            return fused
        qkv = self.qkv_proj(x)
        if self._fused_prep(qkv, cos):
            q_w = None if self.q_norm is None else self.q_norm.weight
            k_w = None if self.k_norm is None else self.k_norm.weight
            backend = ctx.attention
            rows = backend.cache_rows(self.layer_idx) if isinstance(backend, PagedAttention) else None
            if isinstance(backend, PagedAttention) and rows is not None:  # k/v straight into the cache
                q = cpu_kernels.qkv_rope_to_cache(qkv, cos.view(n, -1), sin.view(n, -1), q_w, k_w, self.eps,
                                                  self.num_heads, self.head_dim, *rows)
                return backend.attend(self.layer_idx, q).reshape(n, self.q_size)
            q, k, v = cpu_kernels.qkv_rope(qkv, cos.view(n, -1), sin.view(n, -1), q_w, k_w, self.eps,
                                           self.num_heads, self.num_kv_heads, self.head_dim)
            out = ctx.attention.forward(self.layer_idx, q, k, v)
            return out.reshape(n, self.q_size)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None and not self.per_head_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = k.reshape(n, self.num_kv_heads, self.head_dim)
        v = v.reshape(n, self.num_kv_heads, self.head_dim).contiguous()
        if self.q_norm is not None and self.k_norm is not None and self.per_head_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = RotaryEmbedding.apply(q, cos, sin)
        k = RotaryEmbedding.apply(k, cos, sin)
        out = ctx.attention.forward(self.layer_idx, q, k, v)
        return out.reshape(n, self.q_size)

    def _fused_projection(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          ctx: StepContext) -> torch.Tensor | None:
        """``attend``'s result with the q/k/v projection, QK-norm, RoPE and the K/V store in one
        kernel (``cpu.linear_qkv_rope_to_cache``: the bits of the projection followed by
        ``qkv_rope_to_cache``), or None where it does not apply: the conditions of ``_fused_prep``
        and of ``PagedAttention.cache_rows``, and a projection the kernel multiplies (fp32 weights
        on the kernels, or the bf16-arithmetic format; a prefill's rows)."""
        proj, backend = self.qkv_proj, ctx.attention
        if not (isinstance(backend, PagedAttention) and self._epilogue_takes(proj, x.shape[0])):
            return None
        if not (cpu_kernels.use_rows(x) and x.shape[1] == proj.weight.shape[1] and self._fused_prep(x, cos)):
            return None
        rows = backend.cache_rows(self.layer_idx)
        if rows is None:
            return None
        n = x.shape[0]
        q_w = None if self.q_norm is None else self.q_norm.weight
        k_w = None if self.k_norm is None else self.k_norm.weight
        q = cpu_kernels.linear_qkv_rope_to_cache(x, proj.weight, proj.bias, _bf16dot(proj), cos.view(n, -1),
                                                 sin.view(n, -1), q_w, k_w, self.eps, self.num_heads, self.head_dim,
                                                 *rows)
        return backend.attend(self.layer_idx, q).reshape(n, self.q_size)

    def projects_with_norm(self, rows: int) -> bool:
        """Whether ``project_add_norm`` runs the o-proj with the residual add and norm as its epilogue
        for ``rows`` rows (a prefill's, on the kernels)."""
        return self._epilogue_takes(self.o_proj, rows)

    def project_add_norm(self, o: torch.Tensor, x: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """``cpu_kernels.add_rms_norm(x, self.o_proj(o), norm.weight, norm.eps)`` in one kernel
        (``linear_add_rms_norm``, the same bits), where ``projects_with_norm``; ``o`` from ``attend``."""
        proj = self.o_proj
        return cpu_kernels.linear_add_rms_norm(o.contiguous(), proj.weight, proj.bias, _bf16dot(proj), x, norm.weight,
                                               norm.eps)

    def _epilogue_takes(self, proj: Linear, rows: int) -> bool:
        """Whether ``proj`` multiplies on the kernels with an epilogue (``cpu.use_linear_epilogue``):
        kernels on, fp32 weights on the kernels or the bf16-arithmetic format."""
        if not self.use_kernels or proj.batch_invariant:
            return False
        if not (_bf16dot(proj) or (proj.weight_format is None and proj.use_kernels)):
            return False
        return cpu_kernels.use_linear_epilogue(rows, proj.weight, proj.bias, _bf16dot(proj))

    def _fused_prep(self, qkv: torch.Tensor, cos: torch.Tensor) -> bool:
        """Whether ``cpu_kernels.qkv_rope`` can do this layer's split, QK-norm and RoPE:
        kernels on, fp32 rows, no ``clip_qkv``, QK-norm absent or per head, and the norm
        epsilons equal to the model's."""
        if not (self.use_kernels and self.clip_qkv is None and cpu_kernels.use_rows(qkv) and cos.is_contiguous()):
            return False
        if self.q_norm is None or self.k_norm is None:
            return self.q_norm is None and self.k_norm is None
        return self.per_head_norm and self.q_norm.eps == self.eps == self.k_norm.eps


def _bf16dot(proj: Linear) -> bool:
    """Whether ``proj`` multiplies in the bf16 dot order (the bf16-arithmetic format)."""
    return proj.weight_format is WeightFormat.BF16_DOT
