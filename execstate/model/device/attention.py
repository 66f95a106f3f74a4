"""The torch path's attention backend: the paged KV cache, read through device-side tables.

``StepTables`` holds a step's attention metadata as device tensors (filled by the engine from
its persistent input buffers, ``engine/device_inputs.py``), plus the few host-side integers the
host already knows from the scheduler (the spans): nothing here reads a device value back.

``DevicePagedAttention.forward`` writes the step's K/V into the pool in place (the pool's
layout, unchanged: ``state/kv_pool.py``), then either

- ``triton=True``: the Triton kernel (``kernels/gpu/paged_attention.py``) reads every query
  row's context straight from the block table (decode, prefill after a cached prefix, chunked
  prefill alike; no gathered copy), or
- the torch fallback: a decode-only step gathers each sequence's context slots, computed on the
  device from its block table, into ``[B, L_max]`` and runs SDPA with a length mask (the shape
  of ``model/paged_attention.PagedAttention``'s torch path); other steps run SDPA per span.

``kv_rows`` (CUDA graphs, ``engine/cuda_graphs.py``): a padded batch's pad rows must write their
K/V somewhere; they repeat row 0's K/V into row 0's slot (same bytes twice), so no slot of
another sequence is touched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from execstate.state.kv_pool import KVPool


@dataclass(frozen=True)
class Span:
    """One sequence of the step (host integers): its first row in the flat batch, its query rows,
    and its context length after the step (cached + new)."""

    token_start: int
    num_query: int
    context_len: int


@dataclass(frozen=True)
class StepTables:
    """A step's attention metadata. Device tensors: ``token_seq``/``positions``/``slot_mapping``
    int64 ``[T]``, ``block_table`` int64 ``[B, W]``, ``context_lens`` int64 ``[B]``; ``kv_rows``
    int64 ``[T]`` or None (no pad rows). Host: ``spans`` (one per row of ``block_table``, in order)."""

    token_seq: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    context_lens: torch.Tensor
    block_size: int
    spans: tuple[Span, ...]
    kv_rows: torch.Tensor | None = None

    @property
    def decode_only(self) -> bool:
        return all(s.num_query == 1 for s in self.spans)


class DevicePagedAttention:
    """``AttentionBackend`` over ``pool`` for one step described by ``tables`` (module docstring)."""

    def __init__(self, pool: KVPool, tables: StepTables, triton: bool) -> None:
        self.pool = pool
        self.tables = tables
        self.triton = triton
        self._decode: tuple[torch.Tensor, torch.Tensor] | None = None  # torch fallback, built once per step

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tb = self.tables
        if tb.kv_rows is not None:
            k, v = k.index_select(0, tb.kv_rows), v.index_select(0, tb.kv_rows)
        self.pool.write(layer_idx, tb.slot_mapping, k, v)
        kc, vc = self.pool.k[layer_idx], self.pool.v[layer_idx]
        out = torch.empty_like(q)
        scale = q.shape[-1] ** -0.5
        if self.triton:
            from execstate.kernels.gpu.paged_attention import paged_attention

            return paged_attention(q, kc, vc, out, tb.token_seq, tb.positions, tb.block_table, tb.block_size, scale)
        if tb.decode_only:
            return self._decode_torch(q, kc, vc, scale)
        for i, span in enumerate(tb.spans):
            rows = slice(span.token_start, span.token_start + span.num_query)
            qs = q[rows].transpose(0, 1)
            slots = self._slots(tb.block_table[i : i + 1], span.context_len)[0]
            ks, vs = kc.index_select(0, slots).transpose(0, 1), vc.index_select(0, slots).transpose(0, 1)
            start = span.context_len - span.num_query
            if start == 0:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
            else:
                q_pos = torch.arange(start, span.context_len, device=q.device)
                mask = torch.arange(span.context_len, device=q.device)[None, :] <= q_pos[:, None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
            out[rows] = o.transpose(0, 1)
        return out

    def _slots(self, table: torch.Tensor, length: int) -> torch.Tensor:
        """``[rows, length]`` flat slots of the first ``length`` positions of each table row."""
        bs = self.tables.block_size
        nb = -(-length // bs)
        per_block = torch.arange(bs, device=table.device, dtype=table.dtype)
        return (table[:, :nb, None] * bs + per_block).reshape(table.shape[0], nb * bs)[:, :length]

    def _decode_torch(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, scale: float) -> torch.Tensor:
        tb = self.tables
        b, n_heads, d = q.shape
        n_kv = kc.shape[1]
        if self._decode is None:
            length = max(s.context_len for s in tb.spans)
            slots = self._slots(tb.block_table[:b], length)
            mask = torch.arange(length, device=q.device)[None, :] < tb.context_lens[:b, None]
            self._decode = slots, mask[:, None, None, :]
        slots, mask = self._decode
        qd = q.view(b, n_kv, n_heads // n_kv, d)
        kd = kc[slots].transpose(1, 2)
        vd = vc[slots].transpose(1, 2)
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scale)
        return od.reshape(b, n_heads, d)


class TritonCausalAttention:
    """``AttentionBackend`` for ONE sequence of ``num_tokens`` tokens from position 0, no cache, on
    the Triton paged kernel: the sequence's own K/V are the "cache" (one block of ``num_tokens``
    slots), so every query row is computed exactly as the engine computed it for that token in a
    prefill or a decode (the kernel's result depends on the row's query and context only). The
    scorer's backend in the deterministic mode: scoring a rollout reproduces its logprobs bit for bit."""

    def __init__(self, num_tokens: int, device: torch.device) -> None:
        if num_tokens < 1:
            raise ValueError(f"TritonCausalAttention needs at least one token, got {num_tokens}")
        self.num_tokens = num_tokens
        self.token_seq = torch.zeros(num_tokens, dtype=torch.int64, device=device)
        self.positions = torch.arange(num_tokens, dtype=torch.int64, device=device)
        self.block_table = torch.zeros((1, 1), dtype=torch.int64, device=device)

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from execstate.kernels.gpu.paged_attention import paged_attention

        out = torch.empty_like(q)
        return paged_attention(q, k.contiguous(), v.contiguous(), out, self.token_seq, self.positions,
                               self.block_table, self.num_tokens, q.shape[-1] ** -0.5)
