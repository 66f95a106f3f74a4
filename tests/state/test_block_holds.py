"""BlockHolds: references held by sessions and checkpoints, each released exactly once."""

from __future__ import annotations

import pytest

from execstate.state.block_holds import BlockHolds, HeldBlocks
from execstate.state.block_pool import BlockPool


def test_pin_adopt_hand_over_release_account_every_reference():
    pool = BlockPool(8)
    holds = BlockHolds(pool)
    ids = pool.allocate(3)  # a finished request's blocks
    own = holds.adopt(HeldBlocks(ids, num_tokens=40))
    assert [pool.ref_count(b) for b in ids] == [1, 1, 1] and holds.num_holders == 1
    cp = holds.pin(own)  # a checkpoint: one more reference each, same blocks
    assert cp.block_ids == ids and cp.block_ids is not own.block_ids
    assert [pool.ref_count(b) for b in ids] == [2, 2, 2]
    assert holds.counts() == {b: 2 for b in ids} and holds.num_references == 6
    moved = holds.hand_over(own)  # a step starts: the request owns those references now
    assert moved is own and holds.num_holders == 1 and [pool.ref_count(b) for b in ids] == [2, 2, 2]
    holds.check_integrity()
    holds.release(cp)
    assert [pool.ref_count(b) for b in ids] == [1, 1, 1]
    pool.free(ids)  # the request finishing without handing back
    assert pool.num_used == 0 and holds.num_holders == 0
    pool.check_integrity()


def test_release_twice_and_foreign_records_raise():
    pool = BlockPool(4)
    holds = BlockHolds(pool)
    held = holds.adopt(HeldBlocks(pool.allocate(2), 20))
    holds.release(held)
    with pytest.raises(ValueError, match="released twice"):
        holds.release(held)
    with pytest.raises(ValueError, match="not held"):
        holds.hand_over(HeldBlocks([], 0))
    assert pool.num_used == 0


def test_adopt_refuses_free_blocks_and_duplicates():
    pool = BlockPool(4)
    holds = BlockHolds(pool)
    with pytest.raises(ValueError, match="free"):
        holds.adopt(HeldBlocks([0], 1))
    held = holds.adopt(HeldBlocks(pool.allocate(1), 1))
    with pytest.raises(ValueError, match="already held"):
        holds.adopt(held)


def test_release_frees_tail_first():
    pool = BlockPool(4)
    holds = BlockHolds(pool)
    ids = pool.allocate(3)
    holds.release(holds.adopt(HeldBlocks(ids, 48)))
    assert pool.free_order()[-3:] == list(reversed(ids))


def test_integrity_catches_a_reference_lost_under_a_hold():
    pool = BlockPool(4)
    holds = BlockHolds(pool)
    ids = pool.allocate(1)
    holds.adopt(HeldBlocks(ids, 4))
    holds.pin(holds.adopt(HeldBlocks(pool.allocate(1), 4)))
    pool.free(ids)  # someone freed a reference the hold still claims
    with pytest.raises(AssertionError, match="held 1x with ref_count 0"):
        holds.check_integrity()


def test_reclaim_asks_the_owner():
    holds = BlockHolds(BlockPool(2))
    assert holds.reclaim() is False
    calls = []
    holds.set_reclaimer(lambda: calls.append(1) or True)
    assert holds.reclaim() is True and calls == [1]
