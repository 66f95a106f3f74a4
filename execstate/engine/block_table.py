"""A request's block table: its block ids as a list, mirrored in an int64 array grown in place.

The runners write each scheduled request's block table into the step's tables every step
(``engine/device_inputs.py``, the kernels' ``PagedDecode``). From a list that is a conversion of
every block id, O(context / block_size) Python integers per request per step. ``BlockTable`` is a
``list`` (every reader keeps working) that also keeps ``array()``: the same ids as an int64 numpy
array, appended to as blocks are added (``append`` / ``extend``: amortised O(new blocks)), so a
step copies the table with one ``memcpy`` and converts nothing.

Any other change (an item replaced, as copy-on-write does to a shared tail; items removed) marks
the array stale from that point; the next ``array()`` converts the stale tail once. Slices are
plain lists. Not thread-safe: the engine thread only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, SupportsIndex

import numpy as np

from execstate.state.block_pool import BlockId


class BlockTable(list[BlockId]):
    """Block ids (a list) with an int64 mirror (module docstring)."""

    def __init__(self, ids: Iterable[BlockId] = ()) -> None:
        super().__init__(ids)
        self._array = np.empty(max(16, len(self)), dtype=np.int64)
        self._valid = 0  # the mirror holds the first _valid ids

    def array(self) -> np.ndarray:
        """The ids as int64, a view valid until the table next changes (no conversion when only
        appended to since the last call)."""
        n = len(self)
        if self._valid < n:
            if n > len(self._array):
                grown = np.empty(max(n, 2 * len(self._array)), dtype=np.int64)
                grown[: self._valid] = self._array[: self._valid]
                self._array = grown
            self._array[self._valid : n] = super().__getitem__(slice(self._valid, n))
            self._valid = n
        return self._array[:n]

    def _stale_from(self, i: int) -> None:
        self._valid = min(self._valid, max(i, 0))

    # the changes that are not appends: the mirror is stale from the first item they touch
    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        if isinstance(index, slice):
            self._valid = 0
        else:
            i = index.__index__()
            self._stale_from(i if i >= 0 else len(self) + i)

    def __delitem__(self, index: SupportsIndex | slice) -> None:
        super().__delitem__(index)
        self._valid = 0

    def insert(self, index: SupportsIndex, value: BlockId) -> None:
        super().insert(index, value)
        self._valid = 0

    def pop(self, index: SupportsIndex = -1) -> BlockId:
        got = super().pop(index)
        self._valid = 0
        return got

    def remove(self, value: BlockId) -> None:
        super().remove(value)
        self._valid = 0

    def clear(self) -> None:
        super().clear()
        self._valid = 0

    def reverse(self) -> None:
        super().reverse()
        self._valid = 0

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        self._valid = 0

    def __iadd__(self, ids: Iterable[BlockId]) -> BlockTable:  # type: ignore[override,misc]
        self.extend(ids)
        return self

    def __imul__(self, n: SupportsIndex) -> BlockTable:
        super().__imul__(n)
        self._valid = 0
        return self
