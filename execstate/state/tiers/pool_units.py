"""What each cached block of the pool was computed from, for its write-back (docs/offload.md).

The block pool knows a cached block's key only; a unit's record also names its parent key, its
provenance root, its tokens and its weights version, which only the request that computed the
block had. The KV cache
manager notes them here when it commits a block to the prefix cache (``note``); the write-back
takes them when the pool evicts the block (``pop``). Engine thread only; pure Python.

Holds one entry per cached block at most (an entry leaves with its block), so it is bounded by
the pool's size.
"""

from __future__ import annotations

from typing import NamedTuple

from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId


class UnitOrigin(NamedTuple):
    parent: BlockKey
    root: BlockKey
    token_ids: tuple[int, ...]
    weights_version: str | None = None  # the root's weights version, spelled out for the KV events
    tenant: str | None = None  # the tenant whose request computed it (the KV events filter by it)


class BlockUnit(NamedTuple):
    """A pool block to write as a unit (``OffloadConnector.store_units``): its key, what it was
    computed from, its route rows (``int16`` bytes; None when the engine returns no routes)."""

    block_id: BlockId
    key: BlockKey
    origin: UnitOrigin
    routes: bytes | None


class PoolUnits:
    def __init__(self) -> None:
        self._origins: dict[BlockKey, UnitOrigin] = {}

    def __len__(self) -> int:
        return len(self._origins)

    def note(self, key: BlockKey, parent: BlockKey, root: BlockKey, token_ids: list[int],
             weights_version: str | None = None, tenant: str | None = None) -> None:
        """``key`` was committed to the prefix cache, computed from ``parent`` and ``token_ids``
        under ``root`` (of ``weights_version``) for ``tenant``."""
        self._origins[key] = UnitOrigin(parent, root, tuple(token_ids), weights_version, tenant)

    def get(self, key: BlockKey) -> UnitOrigin | None:
        return self._origins.get(key)

    def pop(self, key: BlockKey) -> UnitOrigin | None:
        """The origin of an evicted block (None when it was never noted); forgotten here."""
        return self._origins.pop(key, None)
