"""BlockHolds: block references held outside running requests (docs/contracts.md 3, 6).

Pure Python, no tensors. A running request holds one reference on each of its blocks and the
scheduler frees them when it finishes. A session keeps its KV between steps, and each of its
checkpoints pins the chain it saved: those references are held *here*, one :class:`HeldBlocks`
record per holder, so that every reference of the pool is accounted for (the engine's
``check_references``: a block's ``ref_count`` == the requests holding it + the holds holding it)
and released exactly once.

Transfers of a record (each changes ownership of the references, never copies KV):

- :meth:`BlockHolds.pin` — a new holder sharing a record's blocks: one more reference each (a
  checkpoint, a fork, a rollback). The partial tail block becomes shared; the KV cache manager
  copies it before anyone writes into it (copy-on-write).
- :meth:`BlockHolds.adopt` — register references that already exist (a finished session step
  hands its request's blocks back instead of freeing them).
- :meth:`BlockHolds.hand_over` — unregister without freeing: the references now belong to a
  request (a session step starts).
- :meth:`BlockHolds.release` — drop every reference (tail first, as requests do), exactly once;
  releasing a record that is not held raises ``ValueError`` (a double release is a bug).

``set_reclaimer`` installs the owner's way of giving blocks back under pressure (the session
layer evicts idle sessions); the engine calls :meth:`BlockHolds.reclaim` when waiting requests
cannot be admitted because holds fill the pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId, BlockPool


@dataclass(eq=False, slots=True)
class HeldBlocks:
    """The KV of a prefix of some owner's tokens.

    ``block_ids[i]`` holds tokens ``[i * block_size, (i + 1) * block_size)``; ``num_tokens`` tokens
    have KV (the last block may be partial); ``block_keys`` are the chain keys of the owner's full
    token blocks known so far; the first ``num_committed_blocks`` blocks are registered in the
    prefix cache (or were hit from it).
    """

    block_ids: list[BlockId]
    num_tokens: int
    block_keys: list[BlockKey] = field(default_factory=list)
    num_committed_blocks: int = 0

    def copy(self) -> HeldBlocks:
        return HeldBlocks(list(self.block_ids), self.num_tokens, list(self.block_keys), self.num_committed_blocks)


class BlockHolds:
    """The registry of :class:`HeldBlocks` records over one :class:`BlockPool` (module docstring)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self._held: dict[int, HeldBlocks] = {}  # by id(record): records are identities, not values
        self._reclaimer: Callable[[], bool] | None = None

    # -- queries ---------------------------------------------------------------------------------
    @property
    def num_holders(self) -> int:
        return len(self._held)

    @property
    def num_references(self) -> int:
        """Block references held (a block pinned by two holders counts twice)."""
        return sum(len(h.block_ids) for h in self._held.values())

    def holds(self, held: HeldBlocks) -> bool:
        return id(held) in self._held and self._held[id(held)] is held

    def counts(self) -> Counter[BlockId]:
        """References held per block."""
        return Counter(b for h in self._held.values() for b in h.block_ids)

    # -- transfers ---------------------------------------------------------------------------------
    def pin(self, src: HeldBlocks) -> HeldBlocks:
        """A new record sharing ``src``'s blocks (one more reference each, no KV copied)."""
        self.pool.acquire(src.block_ids)  # validates every id before acquiring any
        new = src.copy()
        self._held[id(new)] = new
        return new

    def adopt(self, held: HeldBlocks) -> HeldBlocks:
        """Register ``held``, whose references already exist and were owned by nobody else."""
        if self.holds(held):
            raise ValueError("these blocks are already held")
        for b in held.block_ids:
            if self.pool.ref_count(b) < 1:
                raise ValueError(f"block {b} is free; only references that exist can be adopted")
        self._held[id(held)] = held
        return held

    def hand_over(self, held: HeldBlocks) -> HeldBlocks:
        """Unregister ``held`` without freeing: its references now belong to the caller (a request)."""
        self._check_held(held)
        del self._held[id(held)]
        return held

    def release(self, held: HeldBlocks) -> None:
        """Drop one reference per block of ``held`` (tail first) and forget it; exactly once."""
        self._check_held(held)
        del self._held[id(held)]
        self.pool.free(list(reversed(held.block_ids)))

    # -- pressure ----------------------------------------------------------------------------------
    def set_reclaimer(self, fn: Callable[[], bool] | None) -> None:
        """``fn()`` releases some holds (e.g. evicts an idle session) and says whether it did."""
        self._reclaimer = fn

    @property
    def has_reclaimer(self) -> bool:
        """Whether an owner installed its reclaimer (the holds have one owner)."""
        return self._reclaimer is not None

    def reclaim(self) -> bool:
        """Ask the owner of the holds to give some back; True if it released anything."""
        return self._reclaimer() if self._reclaimer is not None else False

    # -- integrity ---------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if a block is held more often than its reference count."""
        for b, n in self.counts().items():
            if self.pool.ref_count(b) < n:
                raise AssertionError(f"block {b} held {n}x with ref_count {self.pool.ref_count(b)}")

    def _check_held(self, held: HeldBlocks) -> None:
        if not self.holds(held):
            raise ValueError("these blocks are not held (released twice, or never registered)")
