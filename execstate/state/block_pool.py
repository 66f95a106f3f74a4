"""BlockPool: bookkeeping of physical KV block ids and the prefix cache map (docs/contracts.md 3).

Pure Python; owns no tensors. Block ids ``0..num_blocks-1`` index the KV pool's slots.

Each block has a ``ref_count`` (running requests, checkpoints, snapshots holding it) and an
optional :data:`BlockKey` set by :meth:`BlockPool.commit` once the block is full and computed.
Blocks with ``ref_count == 0`` sit in an LRU free queue; a free block that still has a key stays
findable by :meth:`BlockPool.lookup` (a prefix-cache hit) until :meth:`BlockPool.allocate`
reuses its slot, which evicts the key and reports it through ``on_evict``.

Invariants (checked by :meth:`BlockPool.check_integrity`):

- the free queue holds exactly the blocks with ``ref_count == 0``, each once;
- ``ref_count >= 0`` for every block;
- the cache map ``key -> block`` and the blocks' ``key`` fields mirror each other exactly;
- ``num_free + num_used == num_blocks``.

Every mutating method validates all its arguments before changing anything: on an exception the
pool is unchanged.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NewType

from execstate.identity.keys import BlockKey, check_key

BlockId = NewType("BlockId", int)
"""Index of a physical KV block slot, ``0 <= id < num_blocks``."""


class NoFreeBlocks(RuntimeError):
    """Raised by :meth:`BlockPool.allocate` when fewer blocks are free than requested."""

    def __init__(self, requested: int, available: int) -> None:
        super().__init__(f"requested {requested} blocks, {available} free")
        self.requested = requested
        self.available = available


@dataclass(slots=True)
class _Block:
    ref_count: int = 0
    key: BlockKey | None = None


class BlockPool:
    """Reference counts, LRU free queue and ``BlockKey -> BlockId`` cache map.

    Eviction hooks, all given at construction (the engine builds its connectors first:
    ``LLMEngine.__init__``), each optional. When :meth:`allocate` reuses the slots of cached blocks
    it calls them after the pool's state is fully updated (so they may inspect the pool), in this
    order (:meth:`_evicted`):

    1. ``write_back(block_id, key)`` per evicted block, in eviction order (the offload tiers): the
       slot still holds the evicted unit's KV (nobody has written it) and its route record is
       still there;
    2. ``on_evict(key)`` per evicted key, in eviction order (the route store's
       ``on_block_evicted``), even if a write-back raised;
    3. ``evict_observer(keys)`` once, with every evicted key in eviction order (the KV events),
       even if an earlier hook raised.

    An exception from a hook propagates from :meth:`allocate` after the later hooks ran (the pool
    is already consistent).
    """

    def __init__(self, num_blocks: int, on_evict: Callable[[BlockKey], None] | None = None, *,
                 write_back: Callable[[BlockId, BlockKey], None] | None = None,
                 evict_observer: Callable[[list[BlockKey]], None] | None = None) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self._blocks = [_Block() for _ in range(num_blocks)]
        self._free: OrderedDict[BlockId, None] = OrderedDict.fromkeys(BlockId(i) for i in range(num_blocks))
        self._cached: dict[BlockKey, BlockId] = {}
        self._on_evict = on_evict
        self._write_back = write_back
        self._evict_observer = evict_observer

    # -- queries ---------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_free(self) -> int:
        """Blocks with ``ref_count == 0`` (cached or not): what :meth:`allocate` can hand out."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks with ``ref_count > 0``."""
        return len(self._blocks) - len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks registered under a key, in use or free."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """``num_used / num_blocks``, in ``[0, 1]``."""
        return self.num_used / len(self._blocks)

    def ref_count(self, block_id: BlockId) -> int:
        return self._blocks[self._index(block_id)].ref_count

    def key_of(self, block_id: BlockId) -> BlockKey | None:
        return self._blocks[self._index(block_id)].key

    def lookup(self, key: BlockKey) -> BlockId | None:
        """The block cached under ``key``, or ``None``. No side effect (LRU order untouched)."""
        return self._cached.get(key)

    def free_order(self) -> list[BlockId]:
        """The free queue, next block to be allocated first (for tests and debugging)."""
        return list(self._free)

    # -- mutations -------------------------------------------------------------------------------

    def allocate(self, n: int) -> list[BlockId]:
        """Take ``n`` blocks from the front of the free queue (least recently freed first).

        Returned blocks have ``ref_count == 1`` and no key; a taken block that had a key is
        removed from the cache map and its key passed to ``on_evict``. Raises
        :class:`NoFreeBlocks` (pool unchanged) if fewer than ``n`` blocks are free.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        if n > len(self._free):
            raise NoFreeBlocks(n, len(self._free))
        taken: list[BlockId] = []
        evicted: list[tuple[BlockId, BlockKey]] = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            if block.key is not None:
                del self._cached[block.key]
                evicted.append((block_id, block.key))
                block.key = None
            block.ref_count = 1
            taken.append(block_id)
        if evicted:
            self._evicted(evicted)
        return taken

    def _evicted(self, evicted: list[tuple[BlockId, BlockKey]]) -> None:
        """The eviction hooks, in their one order (class docstring): write-back, ``on_evict``,
        the observer; each runs even if an earlier one raised."""
        try:
            if self._write_back is not None:
                for block_id, key in evicted:
                    self._write_back(block_id, key)
        finally:
            try:
                if self._on_evict is not None:
                    for _, key in evicted:
                        self._on_evict(key)
            finally:
                if self._evict_observer is not None:
                    self._evict_observer([key for _, key in evicted])

    def acquire(self, block_ids: Iterable[BlockId]) -> None:
        """Add one reference to each block (a prefix-cache hit, a fork, a checkpoint pin).

        Each block must be in use or cached; a free cached block leaves the free queue (it can no
        longer be evicted). Acquiring a free uncached block raises ``ValueError``: its contents
        are garbage and its slot may be handed out by :meth:`allocate` at any time.
        """
        ids = [self._index(b) for b in block_ids]
        for b in ids:
            block = self._blocks[b]
            if block.ref_count == 0 and block.key is None:
                raise ValueError(f"block {b} is free and uncached; allocate it instead of acquiring it")
        for b in ids:
            block = self._blocks[b]
            if block.ref_count == 0:
                del self._free[BlockId(b)]
            block.ref_count += 1

    def free(self, block_ids: Iterable[BlockId]) -> None:
        """Drop one reference per occurrence of each block; blocks reaching 0 join the free queue.

        Blocks reaching 0 are appended to the back of the queue in the order given, so the first
        one given is evicted first. Callers free a request's blocks in **reverse** order (tail
        first): the tail of a sequence is the least likely to be shared, so it is reused before
        the prefix. Freeing a block whose count would drop below 0 raises ``ValueError``.
        """
        ids = [self._index(b) for b in block_ids]
        for b, times in Counter(ids).items():
            if self._blocks[b].ref_count < times:
                raise ValueError(f"block {b} freed {times}x with ref_count {self._blocks[b].ref_count}")
        for b in ids:
            block = self._blocks[b]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[BlockId(b)] = None

    def commit(self, block_id: BlockId, key: BlockKey) -> bool:
        """Register a full, computed block under ``key`` so later requests can hit it.

        The block must be in use and uncached (``ValueError`` otherwise). If another block already
        holds ``key`` the existing mapping is kept and this block stays uncached: returns False
        (the caller keeps using its own copy; it is freed like any uncached block). Else True.
        """
        b = self._index(block_id)
        check_key(key)
        block = self._blocks[b]
        if block.ref_count == 0:
            raise ValueError(f"block {b} is free; only an allocated block can be committed")
        if block.key is not None:
            raise ValueError(f"block {b} is already committed")
        if key in self._cached:
            return False
        block.key = key
        self._cached[key] = BlockId(b)
        return True

    # -- integrity -------------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant (see module docstring)."""
        zero = {i for i, blk in enumerate(self._blocks) if blk.ref_count == 0}
        negative = [i for i, blk in enumerate(self._blocks) if blk.ref_count < 0]
        if negative:
            raise AssertionError(f"ref_count >= 0: blocks {negative[:8]} are negative")
        if set(self._free) != zero:
            raise AssertionError(
                "free queue == blocks with ref_count 0: "
                f"queued but in use {sorted(set(self._free) - zero)[:8]}, "
                f"unqueued at 0 {sorted(zero - set(self._free))[:8]}"
            )
        for key, b in self._cached.items():
            if not 0 <= b < len(self._blocks) or self._blocks[b].key != key:
                raise AssertionError(
                    f"cache map consistent: key {key.hex()[:16]} maps to block {b} without it"
                )
        keyed = sum(1 for blk in self._blocks if blk.key is not None)
        if keyed != len(self._cached):
            raise AssertionError(
                f"cache map consistent: {keyed} keyed blocks, {len(self._cached)} map entries"
            )
        used = sum(1 for blk in self._blocks if blk.ref_count > 0)
        if self.num_used != used or self.num_free + used != len(self._blocks):
            raise AssertionError(
                f"counts add up: num_free {self.num_free} + used {used} != {len(self._blocks)}"
            )

    def _index(self, block_id: BlockId) -> int:
        if (
            isinstance(block_id, bool)
            or not isinstance(block_id, int)
            or not 0 <= block_id < len(self._blocks)
        ):
            raise ValueError(f"invalid block id {block_id!r} for a pool of {len(self._blocks)}")
        return int(block_id)
