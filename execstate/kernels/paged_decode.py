"""Decode attention straight on the paged KV cache's block tables (C: ``decode_attention``; a
plan from ``PagedDecode.for_spans`` runs ``prefill_attention``, the same results tiled by span)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from execstate.kernels.ext import lib, require, sync_threads

MAX_TILED_GROUP = 16  # query heads per KV head the tiled prefill kernel takes


class PagedDecode:
    """Decode attention over a paged KV cache for one step's decode sequences.

    Built once per step from plain lists (validated here, so the per-layer ``run`` only checks
    tensor shapes): for sequence ``b``, its query is row ``tokens[b]`` of the step's flat batch,
    its K/V lie in blocks ``block_tables[b]`` (slot = block * block_size + offset) and it
    attends to its first ``ctx_lens[b]`` positions (at least 1, at most
    ``len(block_tables[b]) * block_size``; block ids below ``num_slots // block_size``).
    """

    def __init__(self, tokens: list[int], block_tables: Sequence[Sequence[int] | np.ndarray], ctx_lens: list[int],
                 block_size: int, num_slots: int) -> None:
        lib()  # RuntimeError when the kernels are unavailable
        if block_size < 1:
            raise ValueError(f"PagedDecode: block_size must be >= 1, got {block_size}")
        if not (len(tokens) == len(block_tables) == len(ctx_lens)):
            raise ValueError("PagedDecode: tokens, block_tables and ctx_lens must have one entry per sequence")
        num_blocks = num_slots // block_size
        width = max((len(t) for t in block_tables), default=1)
        rows = []
        for b, (table, n) in enumerate(zip(block_tables, ctx_lens, strict=True)):
            if not 1 <= n <= len(table) * block_size:
                raise ValueError(f"PagedDecode: sequence {b} has ctx_len {n} for {len(table)} blocks of {block_size}")
            try:  # converted and checked in C: no Python loop over a context's blocks
                row = np.asarray(table, dtype=np.int64)
            except OverflowError:
                row = np.asarray([-1])
            if row.min() < 0 or row.max() >= num_blocks:
                raise ValueError(f"PagedDecode: sequence {b} has a block id outside [0, {num_blocks})")
            rows.append(row)
        if any(t < 0 for t in tokens):
            raise ValueError("PagedDecode: token rows must be >= 0")
        self.num_seqs = len(tokens)
        self.tiled = False  # True for for_spans plans (a span's rows adjacent): the tiled kernel runs them
        self.max_token = max(tokens, default=-1)
        self.block_size, self.num_slots = block_size, num_slots
        self.tokens = torch.tensor(tokens, dtype=torch.int64)
        self.ctx_lens = torch.tensor(ctx_lens, dtype=torch.int64)
        table_np = np.zeros((len(tokens), width), dtype=np.int64)
        for b, row in enumerate(rows):
            table_np[b, : len(row)] = row
        self.block_table = torch.from_numpy(table_np)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
            scale: float) -> None:
        """``out[tokens[b]] = softmax(q[tokens[b]] K_b^T * scale) V_b`` for every sequence ``b``.

        ``q``/``out`` ``[T, n_heads, d]`` fp32, ``k_cache``/``v_cache`` ``[num_slots, n_kv, d]`` fp32
        or bf16 (both the same), contiguous CPU; query head ``j`` reads KV head
        ``j // (n_heads // n_kv)``. bf16 caches are read widened (exact) by the tiled kernel, so
        the results equal the fp32 kernel's on the widened values bit for bit; they need at most
        ``MAX_TILED_GROUP`` query heads per KV head.
        """
        kv_dtype = torch.bfloat16 if k_cache.dtype is torch.bfloat16 else torch.float32
        for name, t, dt in (("q", q, torch.float32), ("out", out, torch.float32), ("k_cache", k_cache, kv_dtype),
                            ("v_cache", v_cache, kv_dtype)):
            require(t, name, 3, dt)
        n, nh, d = q.shape
        slots, nkv, d2 = k_cache.shape
        if (out.shape != q.shape or v_cache.shape != k_cache.shape or d2 != d or nkv < 1 or nh % nkv
                or slots != self.num_slots):
            raise ValueError(f"PagedDecode: inconsistent shapes q {tuple(q.shape)}, out {tuple(out.shape)}, "
                             f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)} "
                             f"(expected {self.num_slots} slots)")
        if self.max_token >= n:
            raise ValueError(f"PagedDecode: token row {self.max_token} outside a batch of {n}")
        bf16 = kv_dtype is torch.bfloat16
        if bf16 and nh // nkv > MAX_TILED_GROUP:
            raise ValueError(f"PagedDecode: bf16 K/V takes at most {MAX_TILED_GROUP} query heads per KV head, "
                             f"got {nh // nkv}")
        if self.num_seqs:
            sync_threads()
            args = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), self.tokens.data_ptr(),
                    self.block_table.data_ptr(), self.ctx_lens.data_ptr(), self.num_seqs, self.block_table.shape[1],
                    nh, nkv, d, self.block_size, float(scale))
            # the tiled kernel: same results bit for bit, K/V read once per tile of a span's rows (and the
            # kernel that reads bf16 K/V, a tile of one row per decode sequence)
            if bf16 or (self.tiled and nh // nkv <= MAX_TILED_GROUP):
                lib().prefill_attention(*args, int(bf16))
            else:
                lib().decode_attention(*args)

    @classmethod
    def for_spans(cls, token_starts: list[int], num_queries: list[int],
                  block_tables: Sequence[Sequence[int] | np.ndarray],
                  ctx_lens: list[int], block_size: int, num_slots: int) -> PagedDecode:
        """Every query of a step's spans, prefill spans included: span ``s`` holds rows
        ``token_starts[s] ..`` (``num_queries[s]`` of them) whose last one sees ``ctx_lens[s]``
        positions; query ``i`` of the span sees ``ctx_lens[s] - num_queries[s] + i + 1`` (causal).

        Each query row is then computed exactly as a decode query over its context (one
        kernel, one order of operations; no gathered copy of the context), so a token's
        attention output does not depend on how its span was split or batched. Validated per
        span, expanded with torch (no per-token Python loop); a step of single-row spans (decode)
        needs no expansion (after a forward pass each torch op costs ~10-50 us of cold dispatch).
        """
        if not (len(token_starts) == len(num_queries) == len(block_tables) == len(ctx_lens)):
            raise ValueError("PagedDecode.for_spans: one entry per span in every list")
        if any(n < 1 for n in num_queries) or any(c < n for c, n in zip(ctx_lens, num_queries, strict=True)):
            raise ValueError("PagedDecode.for_spans: every span needs 1 <= num_query <= ctx_len")
        if any(s < 0 for s in token_starts):
            raise ValueError("PagedDecode: token rows must be >= 0")
        span_ends = [s + n for s, n in zip(token_starts, num_queries, strict=True)]
        # One entry per span, validated by __init__ (tables, last-query context lengths).
        self = cls([e - 1 for e in span_ends] if span_ends else [], block_tables, ctx_lens, block_size, num_slots)
        if not token_starts:
            return self
        if all(n == 1 for n in num_queries):  # a decode step: one row per span, the expansion below is the identity
            self.tiled = True
            return self
        counts = torch.tensor(num_queries, dtype=torch.int64)
        first = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        offset = torch.arange(int(counts.sum()), dtype=torch.int64) - first  # i within its span
        self.tokens = torch.repeat_interleave(torch.tensor(token_starts, dtype=torch.int64), counts) + offset
        self.ctx_lens = torch.repeat_interleave(self.ctx_lens - counts, counts) + offset + 1
        self.block_table = torch.repeat_interleave(self.block_table, counts, dim=0)
        self.num_seqs = int(self.tokens.shape[0])
        self.tiled = True
        self.max_token = max(span_ends) - 1
        return self
