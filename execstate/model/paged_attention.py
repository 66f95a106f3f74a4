"""Attention over block tables (the engine's AttentionBackend).

A step's flat token batch holds spans, one per scheduled request: ``num_query`` new
tokens whose positions continue a context of ``context_len - num_query`` tokens whose
K/V already sit in the request's blocks. All index tensors are built once per step
(``__init__``) and reused by every layer:

- every layer first writes the new K/V into the pool in place (slot mapping);
- decode spans (one query each) are batched: their contexts are gathered into a
  padded ``[B, L_max]`` view with a boolean mask and GQA is done by folding query
  heads onto their KV head (``[B, n_kv, group, d]``), no K/V repeat;
- prefill spans run one by one: a span with no cached context attends to its own
  fresh K/V causally; a span continuing a context (prefix hit, chunked prefill,
  resumed request) gathers its context and uses an explicit causal mask.

With ``use_kernels`` every query of the step, decode or prefill, runs the C kernel
(``PagedDecode.for_spans``) straight on the block tables: no gathered copy of a context, and
each query row computed the same way whichever span, step or batch it is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from execstate.kernels.decode_layer import DecodeTables
from execstate.kernels.gemm import MAX_LINEAR_ROWS
from execstate.kernels.paged_decode import PagedDecode
from execstate.state.kv_pool import KVPool

# A span of at least this many new tokens has its slot mapping computed with numpy (a prefill's
# thousands of positions: ~1 ms of Python a step); shorter ones (decode) in Python, cheaper there.
_ARRAY_SPAN = 64


@dataclass(frozen=True)
class SeqSpan:
    token_start: int  # index of the span's first token in the flat batch
    num_query: int
    context_len: int  # tokens in context after this step (cached + new)
    block_ids: Sequence[int] | np.ndarray  # the request's blocks (the engine passes BlockTable.array())


class PagedAttention:
    """``use_kernels``: every span (decode and prefill) runs ``execstate.kernels.cpu.PagedDecode``
    straight on the block tables (no gathered copy of the context); otherwise torch SDPA."""

    def __init__(self, pool: KVPool, spans: list[SeqSpan], device: torch.device | str = "cpu",
                 use_kernels: bool = False) -> None:
        self.pool = pool
        bs = pool.block_size
        slot_mapping: list[int] = []
        long_spans: list[np.ndarray] = []  # slots of the spans of many tokens, then of the rest in order
        decode: list[SeqSpan] = []
        self.prefills: list[tuple[int, int, torch.Tensor | None, torch.Tensor | None]] = []
        for span in spans:
            start = span.context_len - span.num_query
            if span.num_query >= _ARRAY_SPAN:  # the same slots, computed as arrays
                if slot_mapping:
                    long_spans.append(np.asarray(slot_mapping, dtype=np.int64))
                    slot_mapping = []
                positions = np.arange(start, span.context_len, dtype=np.int64)
                blocks = np.asarray(span.block_ids[: -(-span.context_len // bs)], dtype=np.int64)
                long_spans.append(blocks[positions // bs] * bs + positions % bs)
            else:
                for pos in range(start, span.context_len):
                    slot_mapping.append(int(span.block_ids[pos // bs]) * bs + pos % bs)
            if use_kernels:
                continue  # every span goes to PagedDecode.for_spans below
            if span.num_query == 1 and start > 0:
                decode.append(span)
            elif start == 0:
                self.prefills.append((span.token_start, span.num_query, None, None))
            else:
                ctx = _context_slots(span, bs, device)
                q_pos = torch.arange(start, span.context_len, device=device)
                mask = torch.arange(span.context_len, device=device)[None, :] <= q_pos[:, None]
                self.prefills.append((span.token_start, span.num_query, ctx, mask))
        if long_spans:
            if slot_mapping:
                long_spans.append(np.asarray(slot_mapping, dtype=np.int64))
            self.slot_mapping = torch.from_numpy(np.concatenate(long_spans)).to(device)
        else:
            self.slot_mapping = torch.tensor(slot_mapping, dtype=torch.long, device=device)
        self.decode_tokens: torch.Tensor | None = None
        self.paged_decode: PagedDecode | None = None
        if spans and use_kernels:
            self.paged_decode = PagedDecode.for_spans(
                [s.token_start for s in spans], [s.num_query for s in spans],
                [s.block_ids[: -(-s.context_len // bs)] for s in spans], [s.context_len for s in spans], bs,
                pool.num_blocks * bs)
        elif decode:
            max_len = max(s.context_len for s in decode)
            idx = torch.zeros((len(decode), max_len), dtype=torch.long)
            mask = torch.zeros((len(decode), 1, 1, max_len), dtype=torch.bool)
            for i, s in enumerate(decode):
                idx[i, : s.context_len] = _context_slots(s, bs, "cpu")
                mask[i, 0, 0, : s.context_len] = True
            self.decode_tokens = torch.tensor([s.token_start for s in decode], dtype=torch.long, device=device)
            self.decode_slots = idx.to(device)
            self.decode_mask = mask.to(device)

    def decode_tables(self) -> DecodeTables | None:
        """The step's tables for the whole-layer decode kernel (``kernels/decode_layer.py``) when
        every span is a decode on the C kernels with at most ``MAX_LINEAR_ROWS`` tokens, else None."""
        pd = self.paged_decode
        if self.prefills or pd is None or self.decode_tokens is not None or not 0 < pd.num_seqs <= MAX_LINEAR_ROWS \
                or self.pool.k.dtype not in (torch.float32, torch.bfloat16):
            return None
        return DecodeTables(self.slot_mapping, pd.tokens, pd.block_table, pd.ctx_lens, pd.block_size, self.pool.k,
                            self.pool.v)

    def cache_rows(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(k_cache, v_cache, slots)`` of layer ``layer_idx`` where the caller may store the step's
        k/v rows itself (token t's at row ``slots[t]``) and then call ``attend``: every span on the C
        kernels and an fp32 pool on the host. None otherwise (then ``forward``)."""
        if self.paged_decode is None or self.prefills or self.decode_tokens is not None:
            return None
        k = self.pool.k
        if k.dtype is not torch.float32 or k.device.type != "cpu":
            return None
        return k[layer_idx], self.pool.v[layer_idx], self.slot_mapping

    def attend(self, layer_idx: int, q: torch.Tensor) -> torch.Tensor:
        """``forward``'s result once the caller stored this layer's k/v rows at ``cache_rows``'s slots."""
        pd = self.paged_decode
        if pd is None:
            raise RuntimeError("PagedAttention.attend: the step has no kernel spans (use forward)")
        out = torch.empty_like(q)
        pd.run(q, self.pool.k[layer_idx], self.pool.v[layer_idx], out, q.shape[2]**-0.5)
        return out

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.write(layer_idx, self.slot_mapping, k, v)
        kc, vc = self.pool.k[layer_idx], self.pool.v[layer_idx]
        n_heads, head_dim = q.shape[1], q.shape[2]
        n_kv = k.shape[1]
        out = torch.empty_like(q)
        if self.paged_decode is not None:
            self.paged_decode.run(q, kc, vc, out, head_dim**-0.5)
        if self.decode_tokens is not None:
            b = self.decode_tokens.shape[0]
            qd = q.index_select(0, self.decode_tokens).view(b, n_kv, n_heads // n_kv, head_dim)
            kd = kc[self.decode_slots].transpose(1, 2)
            vd = vc[self.decode_slots].transpose(1, 2)
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=self.decode_mask)
            out.index_copy_(0, self.decode_tokens, od.reshape(b, n_heads, head_dim))
        for start, n, ctx, mask in self.prefills:
            qp = q[start : start + n].transpose(0, 1)
            if ctx is None:
                kp = k[start : start + n].transpose(0, 1)
                vp = v[start : start + n].transpose(0, 1)
                op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
            else:
                kp = kc[ctx].transpose(0, 1)
                vp = vc[ctx].transpose(0, 1)
                op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, enable_gqa=True)
            out[start : start + n] = op.transpose(0, 1)
        return out


def _context_slots(span: SeqSpan, block_size: int, device: torch.device | str) -> torch.Tensor:
    blocks = torch.tensor(span.block_ids[: -(-span.context_len // block_size)], dtype=torch.long)
    slots = (blocks[:, None] * block_size + torch.arange(block_size)[None, :]).reshape(-1)
    return slots[: span.context_len].to(device)
