"""BlockPool bookkeeping: ref counts, LRU free queue, prefix cache map (docs/contracts.md 3)."""

from __future__ import annotations

import hashlib
import random

import pytest

from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId, BlockPool, NoFreeBlocks


def key(name: str) -> BlockKey:
    return BlockKey(hashlib.sha256(name.encode()).digest())


def ids(*xs: int) -> list[BlockId]:
    return [BlockId(x) for x in xs]


def test_fresh_pool():
    pool = BlockPool(4)
    assert (pool.num_blocks, pool.num_free, pool.num_used, pool.num_cached, pool.usage) == (4, 4, 0, 0, 0.0)
    assert pool.free_order() == ids(0, 1, 2, 3)
    pool.check_integrity()


@pytest.mark.parametrize("n", [0, -1, 2.0, True])
def test_bad_size(n):
    with pytest.raises(ValueError):
        BlockPool(n)


def test_allocate_takes_front_and_sets_ref_count():
    pool = BlockPool(5)
    assert pool.allocate(2) == ids(0, 1)
    assert pool.allocate(0) == []
    assert [pool.ref_count(b) for b in range(5)] == [1, 1, 0, 0, 0]
    assert (pool.num_free, pool.num_used, pool.usage) == (3, 2, 0.4)
    assert pool.key_of(BlockId(0)) is None
    pool.check_integrity()


def test_lru_order_least_recently_freed_first():
    pool = BlockPool(4)
    a = pool.allocate(4)
    assert pool.num_free == 0
    pool.free([a[2]])
    pool.free([a[0], a[3]])
    pool.free([a[1]])
    assert pool.free_order() == ids(2, 0, 3, 1)
    assert pool.allocate(3) == ids(2, 0, 3)
    assert pool.free_order() == ids(1)
    pool.check_integrity()


def test_free_in_reverse_evicts_tail_first():
    evicted: list[BlockKey] = []
    pool = BlockPool(3, on_evict=evicted.append)
    blocks = pool.allocate(3)
    keys = [key(f"b{i}") for i in range(3)]
    for b, k in zip(blocks, keys, strict=True):
        assert pool.commit(b, k)
    pool.free(list(reversed(blocks)))  # request finished: tail first
    assert pool.free_order() == ids(2, 1, 0)
    assert pool.num_cached == 3
    assert pool.allocate(1) == ids(2)
    assert evicted == [keys[2]]
    assert pool.lookup(keys[0]) == 0 and pool.lookup(keys[1]) == 1 and pool.lookup(keys[2]) is None


def test_eviction_callback_order_and_state_at_callback_time():
    seen: list[tuple[BlockKey, int, BlockId | None]] = []
    pool: BlockPool

    def on_evict(k: BlockKey) -> None:
        pool.check_integrity()  # the pool is consistent when the callback runs
        seen.append((k, pool.num_cached, pool.lookup(k)))

    pool = BlockPool(4, on_evict=on_evict)
    blocks = pool.allocate(4)
    pool.commit(blocks[0], key("x"))
    pool.commit(blocks[2], key("y"))
    pool.free(blocks)  # free order 0, 1, 2, 3
    assert pool.allocate(3) == ids(0, 1, 2)
    assert seen == [(key("x"), 0, None), (key("y"), 0, None)]
    assert pool.key_of(BlockId(0)) is None and pool.key_of(BlockId(2)) is None
    assert pool.num_cached == 0


def test_allocate_uncached_blocks_calls_no_callback():
    evicted: list[BlockKey] = []
    pool = BlockPool(2, on_evict=evicted.append)
    pool.free(pool.allocate(2))
    pool.allocate(2)
    assert evicted == []


def test_no_free_blocks_has_no_side_effect():
    evicted: list[BlockKey] = []
    pool = BlockPool(3, on_evict=evicted.append)
    blocks = pool.allocate(3)
    pool.commit(blocks[0], key("a"))
    pool.free([blocks[1], blocks[0]])
    before = (pool.free_order(), pool.num_cached, [pool.ref_count(b) for b in range(3)])
    with pytest.raises(NoFreeBlocks) as exc:
        pool.allocate(3)
    assert (exc.value.requested, exc.value.available) == (3, 2)
    assert (pool.free_order(), pool.num_cached, [pool.ref_count(b) for b in range(3)]) == before
    assert pool.lookup(key("a")) == 0
    assert evicted == []
    pool.check_integrity()


def test_commit_and_lookup():
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    assert pool.lookup(key("k")) is None
    assert pool.commit(b, key("k")) is True
    assert pool.lookup(key("k")) == b
    assert pool.key_of(b) == key("k")
    assert pool.num_cached == 1
    # lookup has no side effect: LRU order and ref counts unchanged.
    order = pool.free_order()
    pool.lookup(key("k"))
    assert pool.free_order() == order and pool.ref_count(b) == 1
    pool.check_integrity()


def test_commit_duplicate_key_keeps_existing_mapping():
    pool = BlockPool(3)
    b0, b1 = pool.allocate(2)
    assert pool.commit(b0, key("k"))
    assert pool.commit(b1, key("k")) is False
    assert pool.lookup(key("k")) == b0
    assert pool.key_of(b1) is None
    assert pool.num_cached == 1
    # The uncached duplicate is freed like any uncached block and does not disturb the mapping.
    pool.free([b1])
    assert pool.allocate(2) == ids(2, 1)
    assert pool.lookup(key("k")) == b0
    pool.check_integrity()


def test_commit_rejects_free_or_already_committed_block_and_bad_key():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    with pytest.raises(ValueError, match="free"):
        pool.commit(BlockId(1), key("x"))
    pool.commit(b, key("x"))
    with pytest.raises(ValueError, match="already committed"):
        pool.commit(b, key("y"))
    (c,) = pool.allocate(1)
    with pytest.raises(ValueError):
        pool.commit(c, BlockKey(b"short"))
    assert pool.key_of(c) is None
    pool.check_integrity()


def test_acquire_free_cached_block_removes_it_from_queue():
    evicted: list[BlockKey] = []
    pool = BlockPool(3, on_evict=evicted.append)
    b0, b1 = pool.allocate(2)
    pool.commit(b0, key("p0"))
    pool.commit(b1, key("p1"))
    pool.free([b1, b0])
    assert pool.free_order() == ids(2, 1, 0)
    hit = pool.lookup(key("p0"))
    assert hit == b0
    pool.acquire([hit])
    assert pool.ref_count(b0) == 1
    assert pool.free_order() == ids(2, 1)
    assert (pool.num_free, pool.num_used, pool.num_cached) == (2, 1, 2)
    # Allocating everything that is free cannot take the acquired block.
    assert pool.allocate(2) == ids(2, 1)
    assert evicted == [key("p1")]
    assert pool.lookup(key("p0")) == b0
    with pytest.raises(NoFreeBlocks):
        pool.allocate(1)
    # Released again, it returns to the back of the queue, still cached.
    pool.free([b0])
    assert pool.free_order() == ids(0) and pool.lookup(key("p0")) == b0
    pool.check_integrity()


def test_acquire_in_use_block_shares_it():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.commit(b, key("s"))
    pool.acquire([b, b])
    assert pool.ref_count(b) == 3
    pool.free([b])
    pool.free([b, b])
    assert pool.ref_count(b) == 0 and pool.free_order() == ids(1, 0)
    pool.check_integrity()


def test_acquire_free_uncached_block_raises_without_side_effect():
    pool = BlockPool(3)
    b0, b1 = pool.allocate(2)
    pool.commit(b0, key("c"))
    pool.free([b0, b1])
    order = pool.free_order()
    with pytest.raises(ValueError, match="uncached"):
        pool.acquire([b0, b1])  # b0 is fine, b1 is not: nothing happens
    assert pool.free_order() == order
    assert pool.ref_count(b0) == 0
    pool.check_integrity()


def test_free_errors_have_no_side_effect():
    pool = BlockPool(3)
    b0, b1 = pool.allocate(2)
    with pytest.raises(ValueError, match="ref_count"):
        pool.free([BlockId(2)])  # never allocated
    with pytest.raises(ValueError, match="2x"):
        pool.free([b0, b1, b0])  # b0 has one reference
    assert pool.ref_count(b0) == 1 and pool.ref_count(b1) == 1
    assert pool.free_order() == ids(2)
    pool.free([b0])
    with pytest.raises(ValueError):
        pool.free([b0])  # double free
    pool.check_integrity()


@pytest.mark.parametrize("bad", [-1, 3, 1.0, True, "0"])
def test_invalid_block_ids_rejected(bad):
    pool = BlockPool(3)
    pool.allocate(3)
    for op in (pool.free, pool.acquire):
        with pytest.raises(ValueError, match="invalid block id"):
            op([bad])
    with pytest.raises(ValueError, match="invalid block id"):
        pool.commit(bad, key("k"))
    pool.check_integrity()


def test_allocate_rejects_bad_n():
    pool = BlockPool(3)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            pool.allocate(bad)
    assert pool.num_free == 3


# -- check_integrity catches corruption ---------------------------------------------------------


def _busy_pool() -> BlockPool:
    pool = BlockPool(4)
    b = pool.allocate(3)
    pool.commit(b[0], key("a"))
    pool.commit(b[1], key("b"))
    pool.free([b[1]])
    pool.check_integrity()
    return pool


def test_integrity_catches_in_use_block_in_free_queue():
    pool = _busy_pool()
    pool._free[BlockId(0)] = None
    with pytest.raises(AssertionError, match="free queue"):
        pool.check_integrity()


def test_integrity_catches_free_block_missing_from_queue():
    pool = _busy_pool()
    del pool._free[BlockId(3)]
    with pytest.raises(AssertionError, match="free queue"):
        pool.check_integrity()


def test_integrity_catches_negative_ref_count():
    pool = _busy_pool()
    pool._blocks[2].ref_count = -1
    with pytest.raises(AssertionError, match="ref_count >= 0"):
        pool.check_integrity()


def test_integrity_catches_cache_map_pointing_at_wrong_block():
    pool = _busy_pool()
    pool._cached[key("a")] = BlockId(2)
    with pytest.raises(AssertionError, match="cache map"):
        pool.check_integrity()


def test_integrity_catches_block_key_missing_from_map():
    pool = _busy_pool()
    pool._blocks[2].key = key("ghost")
    with pytest.raises(AssertionError, match="cache map"):
        pool.check_integrity()


# -- randomized -------------------------------------------------------------------------------


def test_randomized_ops_keep_invariants():
    rng = random.Random(1234)
    n_blocks = 16
    evicted: list[BlockKey] = []
    pool = BlockPool(n_blocks, on_evict=evicted.append)
    refs: dict[int, int] = {}  # model: block -> references held by "requests"
    cache: dict[BlockKey, int] = {}  # model of the cache map
    counts = dict.fromkeys(("alloc", "nofree", "evict", "free", "commit", "dup", "acquire", "revive"), 0)
    for step in range(2000):
        op = rng.random()
        held = [b for b, r in refs.items() if r > 0]
        if op < 0.3:
            n = rng.randint(0, 5)
            if n > pool.num_free:
                with pytest.raises(NoFreeBlocks):
                    pool.allocate(n)
                counts["nofree"] += 1
            else:
                before = len(evicted)
                got = pool.allocate(n)
                assert len(got) == n == len(set(got))
                for b in got:
                    assert refs.get(b, 0) == 0
                    refs[b] = 1
                for k in evicted[before:]:
                    assert cache.pop(k) in got
                    counts["evict"] += 1
                counts["alloc"] += 1
        elif op < 0.6 and held:
            chosen = rng.sample(held, rng.randint(1, len(held)))
            pool.free(chosen)
            for b in chosen:
                refs[b] -= 1
            counts["free"] += 1
        elif op < 0.8 and held:
            b = rng.choice(held)
            k = key(f"k{rng.randint(0, 15)}")
            if pool.key_of(BlockId(b)) is None:
                ok = pool.commit(BlockId(b), k)
                assert ok == (k not in cache)
                if ok:
                    cache[k] = b
                else:
                    counts["dup"] += 1
                counts["commit"] += 1
        elif cache:
            k = rng.choice(sorted(cache))
            b = pool.lookup(k)
            assert b == cache[k]
            if pool.ref_count(b) == 0:
                counts["revive"] += 1  # a prefix hit on a free cached block
            pool.acquire([b])
            refs[b] = refs.get(b, 0) + 1
            counts["acquire"] += 1
        pool.check_integrity()
        assert pool.num_used == sum(1 for r in refs.values() if r > 0), step
        assert pool.num_cached == len(cache)
        assert all(pool.ref_count(BlockId(b)) == r for b, r in refs.items())
        assert all(pool.lookup(k) == b for k, b in cache.items())
    assert min(counts.values()) > 20, str(counts)  # every path was exercised
