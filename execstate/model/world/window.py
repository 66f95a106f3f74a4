"""Rolling K/V window with an attention sink, as block-table operations (pure Python, no torch).

A session's block table is a list of chunks, each the tuple of block ids holding that chunk's
K/V, oldest first. The window keeps the first ``sink_chunks`` chunks (the sink: the start of the
world, which the model can always look back at) and the newest ``window_chunks``; the chunks in
between are dropped from the table and their block ids returned for the caller to release
(``BlockPool.free``), so memory stays bounded however long the session runs. Nothing is copied:
the kept chunks stay in their blocks, and time positions are assigned by order when a step
gathers its context (``rope``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

Chunk = tuple[int, ...]
T = TypeVar("T")  # a chunk, or whatever a caller keeps per chunk (a session: its held blocks)


@dataclass(frozen=True)
class RollingWindow:
    sink_chunks: int
    window_chunks: int

    def __post_init__(self) -> None:
        if self.sink_chunks < 0 or self.window_chunks < 1:
            raise ValueError(f"need sink_chunks >= 0 and window_chunks >= 1, got {self.sink_chunks}, "
                             f"{self.window_chunks}")

    @property
    def max_chunks(self) -> int:
        """Chunks a table holds at most after :meth:`roll`."""
        return self.sink_chunks + self.window_chunks

    def context(self, table: Sequence[T]) -> list[T]:
        """The chunks a step attends to: the sink, then the newest ``window_chunks``."""
        if len(table) <= self.max_chunks:
            return list(table)
        return list(table[: self.sink_chunks]) + list(table[len(table) - self.window_chunks :])

    def roll(self, table: Sequence[Chunk]) -> tuple[list[Chunk], list[int]]:
        """``(kept table, released block ids)``: drop the middle chunks beyond the window."""
        kept = self.context(table)
        keep_ids = {b for c in kept for b in c}
        released = [b for c in table for b in c if b not in keep_ids]
        return kept, released
