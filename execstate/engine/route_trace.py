"""Per-request R3 route rows (pure numpy, no model).

Row ``i`` is the routing of the forward pass over token ``i`` of the request (prompt
and generated tokens together). Rows arrive from two sources: copied from the
route records of prefix-cache hits (``fill`` at admission) and captured from fresh
forward passes. Rows are known for a contiguous prefix ``[0, rows_known)``.

Keep-first rule: a row, once known, is never overwritten. After a preemption the
request recomputes its KV; the rows of the first computation are the ones that
produced the tokens it already sampled, so they are the ones returned (with
deterministic numerics both are equal anyway). Rows are never dropped or zeroed.
"""

from __future__ import annotations

import numpy as np


class MissingRoutesError(RuntimeError):
    """The trace lacks rows that an output must return (fail closed, never zeros)."""


class RouteTrace:
    def __init__(self, num_moe_layers: int, top_k: int, capacity: int = 64) -> None:
        self.num_moe_layers = num_moe_layers
        self.top_k = top_k
        self._rows = np.empty((max(capacity, 1), num_moe_layers, top_k), dtype=np.int16)
        self.rows_known = 0

    def _reserve(self, n: int) -> None:
        if n > len(self._rows):
            grown = np.empty((max(n, 2 * len(self._rows)), self.num_moe_layers, self.top_k), np.int16)
            grown[: self.rows_known] = self._rows[: self.rows_known]
            self._rows = grown

    def fill(self, start: int, rows: np.ndarray) -> None:
        """Record rows for tokens ``[start, start + len(rows))``; known rows are kept."""
        if start > self.rows_known:
            raise ValueError(f"route rows must be contiguous: start {start} > known {self.rows_known}")
        if rows.shape[1:] != (self.num_moe_layers, self.top_k):
            raise ValueError(f"route rows have shape {rows.shape}, expected [n, {self.num_moe_layers}, {self.top_k}]")
        end = start + len(rows)
        if end <= self.rows_known:
            return
        self._reserve(end)
        skip = self.rows_known - start
        self._rows[self.rows_known : end] = rows[skip:]
        self.rows_known = end

    def rows(self, start: int, end: int) -> np.ndarray:
        if end > self.rows_known:
            raise MissingRoutesError(f"route rows [{start}, {end}) requested, only {self.rows_known} known")
        return self._rows[start:end]

    def result(self, num_tokens: int, prompt_start: int) -> np.ndarray:
        """The R3 array: rows ``[prompt_start, num_tokens - 1)`` as a fresh int16 array."""
        end = num_tokens - 1
        start = min(prompt_start, end)
        return self.rows(start, end).copy()
