"""RouteStore: R3 route records of cached blocks, keyed by block key (docs/contracts.md 3, 4).

A route record is ``int16[block_size, n_moe_layers, top_k]``: row ``t`` holds, for each MoE
layer, the experts chosen for the block's token ``t`` when its KV was computed. Together with the
KV block and its provenance it forms one consistency unit. Records are keyed by
:data:`BlockKey`, never by physical slot, so a block restored into another slot keeps its routes.

Lifetimes:

- :meth:`RouteStore.put` stores a record when its block is committed to the prefix cache.
- :meth:`RouteStore.lease` / :meth:`RouteStore.release`: a request (or an unfinished output, a
  transfer snapshot) that will read a record holds a lease on it.
- :meth:`RouteStore.on_block_evicted`: the KV block left the prefix cache. The record is dropped
  at once if unleased; otherwise it is *pending drop*: still readable by ``get`` for its
  leaseholders, and dropped when the last lease is released.
- A missing record means "recompute" (fail closed): ``get`` returns ``None``, never zero rows.

Stored arrays are private read-only copies; ``get`` returns them without copying.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from execstate.identity.keys import BlockKey, check_key

ROUTE_DTYPE = np.dtype(np.int16)


class RouteStore:
    """Route records for one model's MoE layout; see the module docstring for lifetimes.

    If ``n_experts`` is given, :meth:`put` also checks that every value is in ``[0, n_experts)``
    and that no row names an expert twice (the R3 contract, docs/contracts.md 4).
    """

    def __init__(self, block_size: int, n_moe_layers: int, top_k: int, n_experts: int | None = None) -> None:
        for name, v in (("block_size", block_size), ("n_moe_layers", n_moe_layers), ("top_k", top_k)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if n_experts is not None and (
            isinstance(n_experts, bool) or not isinstance(n_experts, int) or n_experts < top_k
        ):
            raise ValueError(f"n_experts must be an int >= top_k ({top_k}), got {n_experts!r}")
        self.record_shape: tuple[int, int, int] = (block_size, n_moe_layers, top_k)
        self.n_experts = n_experts
        self._records: dict[BlockKey, np.ndarray] = {}
        self._leases: dict[BlockKey, int] = {}  # only keys with count > 0
        self._pending_drop: set[BlockKey] = set()  # evicted from the prefix cache, still leased

    # -- queries ---------------------------------------------------------------------------------

    @property
    def num_records(self) -> int:
        return len(self._records)

    @property
    def nbytes(self) -> int:
        """Bytes held by record arrays (every record has the same size)."""
        return len(self._records) * int(np.prod(self.record_shape)) * ROUTE_DTYPE.itemsize

    @property
    def num_pending_drop(self) -> int:
        return len(self._pending_drop)

    def has(self, key: BlockKey) -> bool:
        return key in self._records

    def get(self, key: BlockKey) -> np.ndarray | None:
        """The read-only record for ``key``, or ``None`` if there is none (recompute)."""
        return self._records.get(key)

    def lease_count(self, key: BlockKey) -> int:
        return self._leases.get(key, 0)

    def is_pending_drop(self, key: BlockKey) -> bool:
        return key in self._pending_drop

    # -- mutations -------------------------------------------------------------------------------

    def put(self, key: BlockKey, rows: np.ndarray) -> bool:
        """Store a copy of ``rows`` as the record for ``key``; True if ``rows`` is now the live record.

        ``rows`` must be an ``int16`` ndarray of shape ``record_shape`` (``TypeError`` /
        ``ValueError`` otherwise; nothing is cast). First writer wins:

        - no record: store it, return True;
        - a live record: keep it, return False;
        - a pending-drop record (its block was evicted, leases outstanding) with byte-equal
          rows: revive it (no longer pending drop), return True;
        - a pending-drop record with different rows: keep it for its leaseholders, still pending
          drop, return False. The caller's block must not be cached under ``key``, since a later
          hit would return rows that did not produce its KV.
        """
        check_key(key)
        self._validate(rows)
        existing = self._records.get(key)
        if existing is not None:
            if key in self._pending_drop and np.array_equal(existing, rows):
                self._pending_drop.discard(key)
                return True
            return False
        record = np.array(rows, dtype=ROUTE_DTYPE, order="C", copy=True)
        record.setflags(write=False)
        self._records[key] = record
        return True

    def lease(self, keys: Iterable[BlockKey]) -> None:
        """Add one lease per occurrence of each key. Every key must have a record (``KeyError``,
        nothing leased, otherwise): check :meth:`has` first and recompute blocks without one."""
        keys = list(keys)
        missing = [k for k in keys if k not in self._records]
        if missing:
            raise KeyError(f"no route record for {len(missing)} key(s), e.g. {missing[0].hex()[:16]}")
        for k in keys:
            self._leases[k] = self._leases.get(k, 0) + 1

    def release(self, keys: Iterable[BlockKey]) -> None:
        """Drop one lease per occurrence of each key; a pending-drop record whose last lease goes is
        dropped. Releasing more leases than held raises ``ValueError`` (nothing released)."""
        keys = list(keys)
        for k, times in Counter(keys).items():
            if self._leases.get(k, 0) < times:
                raise ValueError(f"release of {k.hex()[:16]} {times}x with {self._leases.get(k, 0)} lease(s)")
        for k in keys:
            left = self._leases[k] - 1
            if left:
                self._leases[k] = left
                continue
            del self._leases[k]
            if k in self._pending_drop:
                self._pending_drop.discard(k)
                del self._records[k]

    def on_block_evicted(self, key: BlockKey) -> None:
        """The KV block for ``key`` left the prefix cache (``BlockPool`` ``on_evict`` hook).

        Unleased record: dropped now. Leased: pending drop until the last release. No record:
        no-op (a non-MoE block, or a record already dropped).
        """
        if key not in self._records:
            return
        if self._leases.get(key, 0):
            self._pending_drop.add(key)
        else:
            del self._records[key]

    def drop(self, key: BlockKey) -> bool:
        """Remove the record now, leases notwithstanding (tests, fault injection); True if it existed.

        Outstanding leases stay counted and can still be released; ``get`` returns ``None``.
        """
        self._pending_drop.discard(key)
        return self._records.pop(key, None) is not None

    # -- integrity -------------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant."""
        for k, rec in self._records.items():
            if rec.shape != self.record_shape or rec.dtype != ROUTE_DTYPE or rec.flags.writeable:
                raise AssertionError(f"records are read-only int16{list(self.record_shape)}: {k.hex()[:16]}")
        bad = [k for k, n in self._leases.items() if n <= 0]
        if bad:
            raise AssertionError(f"lease counts > 0: {bad[0].hex()[:16]} has {self._leases[bad[0]]}")
        if not self._pending_drop <= self._records.keys():
            raise AssertionError("pending drop keys have records")
        if not self._pending_drop <= self._leases.keys():
            raise AssertionError("pending drop keys are leased (an unleased one should have been dropped)")

    def _validate(self, rows: np.ndarray) -> None:
        if not isinstance(rows, np.ndarray):
            raise TypeError(f"rows must be a numpy array, got {type(rows).__name__}")
        if rows.dtype != ROUTE_DTYPE:
            raise TypeError(f"rows must be int16, got {rows.dtype}")
        if rows.shape != self.record_shape:
            raise ValueError(f"rows must have shape {self.record_shape}, got {rows.shape}")
        if self.n_experts is not None:
            if rows.min() < 0 or rows.max() >= self.n_experts:
                raise ValueError(
                    f"expert ids must be in [0, {self.n_experts}), got [{rows.min()}, {rows.max()}]"
                )
            s = np.sort(rows, axis=-1)
            if (s[..., 1:] == s[..., :-1]).any():
                raise ValueError("a row names the same expert twice")
