"""Persistent per-step input buffers of the torch path, filled without stalling the device.

Every step's inputs (token ids, positions, KV slot of each token, each token's sequence, the
block tables, context lengths, which rows get logits) are written by the host into staging
arrays (pinned memory on a CUDA device) and copied to device buffers allocated once, with
``non_blocking=True``: the copies queue behind the previous step's work and the host never
waits for them. On the CPU the staging arrays are the buffers (no copy).

Buffers are sized for ``max_tokens`` tokens and ``max_seqs`` sequences of ``max_blocks``
blocks; a step beyond that grows them (new allocations: CUDA graphs captured on the old ones
are dropped by their owner, who checks ``generation``). The staging arrays are rewritten by
the next ``load``: the engine reads each step's sampled ids (its one sync) before the next
step starts, so no copy can still be reading them.

``load`` returns the step's ``StepTables`` (``model/device/attention.py``) and views of the
buffers; a decode batch may be padded to a CUDA graph's batch size (``pad_to``): pad rows take
token 0 at position 0 of sequence 0 and repeat row 0's K/V slot (``kv_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from execstate.engine.scheduler import SchedulerOutput
from execstate.model.device.attention import Span, StepTables

_TOKEN_FIELDS = ("ids", "positions", "slots", "token_seq", "kv_rows")
_SEQ_FIELDS = ("context_lens", "logit_rows")


@dataclass(frozen=True)
class StepInputs:
    """One step's device inputs: ``ids``/``positions`` ``[T]``, the attention ``tables``,
    ``logit_rows`` ``[S]`` (the flat row of each sampling sequence's last token), and host facts:
    ``offsets`` (each scheduled span's first row), ``sample_rows`` (indices into
    ``sched.scheduled``), ``num_tokens`` (real rows; ``T`` may be larger when padded)."""

    ids: torch.Tensor
    positions: torch.Tensor
    tables: StepTables
    logit_rows: torch.Tensor
    offsets: list[int]
    sample_rows: list[int]
    num_tokens: int


class DeviceInputs:
    """The persistent buffers (module docstring). Not thread-safe: the engine thread only."""

    def __init__(self, device: torch.device, block_size: int, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        self.device = device
        self.block_size = block_size
        self.generation = 0  # bumped whenever the buffers are reallocated
        self._alloc(max(1, max_tokens), max(1, max_seqs), max(1, max_blocks))

    def _alloc(self, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks
        pinned = self.device.type == "cuda"
        shapes = {**{f: (max_tokens,) for f in _TOKEN_FIELDS}, **{f: (max_seqs,) for f in _SEQ_FIELDS},
                  "block_table": (max_seqs, max_blocks)}
        self._host_t = {f: torch.zeros(s, dtype=torch.int64, pin_memory=pinned) for f, s in shapes.items()}
        self.host = {f: t.numpy() for f, t in self._host_t.items()}
        if self.device.type == "cpu":
            self.dev = self._host_t
        else:
            self.dev = {f: torch.zeros(s, dtype=torch.int64, device=self.device) for f, s in shapes.items()}
        self.generation += 1

    def load(self, sched: SchedulerOutput, pad_to: int | None = None) -> StepInputs:
        """Stage ``sched``'s inputs and queue their copies. ``pad_to``: pad a decode-only step
        (one token per sequence) to that many rows (a CUDA graph's batch size)."""
        scheduled = sched.scheduled
        n_tok = sum(s.num_new_tokens for s in scheduled)
        n_seq = len(scheduled)
        rows = max(pad_to or 0, n_seq) if pad_to is not None else n_tok
        widest = max(-(-(s.num_computed_before + s.num_new_tokens) // self.block_size) for s in scheduled)
        if max(n_tok, rows) > self.max_tokens or max(n_seq, rows) > self.max_seqs or widest > self.max_blocks:
            self._alloc(max(n_tok, rows, self.max_tokens), max(n_seq, rows, self.max_seqs),
                        max(widest, self.max_blocks))
        h = self.host
        bs = self.block_size
        spans: list[Span] = []
        offsets: list[int] = []
        sample_rows: list[int] = []
        logit_rows: list[int] = []
        t = 0
        for i, s in enumerate(scheduled):
            req = s.request
            start, n = s.num_computed_before, s.num_new_tokens
            end = start + n
            blocks = req.block_ids.array()  # int64, grown in place: a memcpy, no conversion
            nb = -(-end // bs)
            h["block_table"][i, :nb] = blocks[:nb]
            h["context_lens"][i] = end
            offsets.append(t)
            spans.append(Span(t, n, end))
            if n == 1:  # a decode: one token of the request's list, O(1) whatever its context
                h["ids"][t] = req.all_token_ids[start]
                h["positions"][t] = start
                h["slots"][t] = int(blocks[start // bs]) * bs + start % bs
            else:  # a prefill chunk: the span it runs, sliced from the request's list
                pos = np.arange(start, end)
                h["ids"][t : t + n] = req.all_token_ids[start:end]
                h["positions"][t : t + n] = pos
                h["slots"][t : t + n] = blocks[:nb][pos // bs] * bs + pos % bs
            h["token_seq"][t : t + n] = i
            if s.samples:
                sample_rows.append(i)
                logit_rows.append(t + n - 1)
            t += n
        h["logit_rows"][: len(logit_rows)] = logit_rows
        kv_rows = None
        if rows > n_tok:  # pad rows (CUDA graph batch): token 0, position 0, sequence 0, row 0's slot
            h["ids"][n_tok:rows] = 0
            h["positions"][n_tok:rows] = 0
            h["token_seq"][n_tok:rows] = 0
            h["slots"][n_tok:rows] = h["slots"][0]
            h["context_lens"][n_seq:rows] = 1
            h["block_table"][n_seq:rows, 0] = h["block_table"][0, 0]
            h["kv_rows"][:n_tok] = np.arange(n_tok)
            h["kv_rows"][n_tok:rows] = 0
            kv_rows = self._copy("kv_rows", rows)
        n_rows = max(rows, n_seq)
        width = max(widest, 1)
        table = self._copy_table(n_rows, width)
        tables = StepTables(self._copy("token_seq", rows), self._copy("positions", rows), self._copy("slots", rows),
                            table, self._copy("context_lens", n_rows), bs, tuple(spans), kv_rows)
        return StepInputs(self._copy("ids", rows), tables.positions, tables, self._copy("logit_rows", len(logit_rows)),
                          offsets, sample_rows, n_tok)

    def _copy(self, field: str, n: int) -> torch.Tensor:
        dst = self.dev[field][:n]
        if self.device.type != "cpu":
            dst.copy_(self._host_t[field][:n], non_blocking=True)
        return dst

    def _copy_table(self, rows: int, width: int) -> torch.Tensor:
        dst = self.dev["block_table"][:rows]
        if self.device.type != "cpu":
            dst.copy_(self._host_t["block_table"][:rows], non_blocking=True)
        return dst[:, :width]
