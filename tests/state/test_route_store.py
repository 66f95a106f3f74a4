"""RouteStore: R3 route records keyed by block key, leases and eviction (docs/contracts.md 3, 4)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockPool
from execstate.state.route_store import RouteStore

BS, LAYERS, TOPK, EXPERTS = 4, 3, 2, 8
SHAPE = (BS, LAYERS, TOPK)


def key(name: str) -> BlockKey:
    return BlockKey(hashlib.sha256(name.encode()).digest())


def rows(seed: int) -> np.ndarray:
    """A valid record: distinct experts per row, all in [0, EXPERTS)."""
    rng = np.random.default_rng(seed)
    out = np.empty(SHAPE, dtype=np.int16)
    for t in range(BS):
        for layer in range(LAYERS):
            out[t, layer] = rng.choice(EXPERTS, size=TOPK, replace=False)
    return out


@pytest.fixture
def store() -> RouteStore:
    return RouteStore(BS, LAYERS, TOPK, n_experts=EXPERTS)


def test_put_get_copies_and_is_read_only(store):
    r = rows(0)
    assert store.put(key("a"), r) is True
    got = store.get(key("a"))
    assert got is not None
    np.testing.assert_array_equal(got, r)
    assert got.dtype == np.int16 and got.shape == SHAPE
    r[0, 0, 0] = 7 - r[0, 0, 0]  # the caller's buffer is reused...
    assert not np.array_equal(store.get(key("a")), r)  # ...the record is a copy
    with pytest.raises(ValueError, match="read-only"):
        got[0, 0, 0] = 1
    assert store.has(key("a")) and store.num_records == 1
    assert store.nbytes == BS * LAYERS * TOPK * 2
    store.check_integrity()


def test_missing_record_is_none(store):
    assert store.get(key("nope")) is None
    assert store.has(key("nope")) is False
    store.put(key("a"), rows(0))
    assert store.drop(key("a")) is True
    assert store.get(key("a")) is None  # fail closed: no zero rows, no stale rows
    assert store.drop(key("a")) is False
    assert (store.num_records, store.nbytes) == (0, 0)


def test_first_writer_wins(store):
    assert store.put(key("a"), rows(0))
    assert store.put(key("a"), rows(1)) is False
    np.testing.assert_array_equal(store.get(key("a")), rows(0))
    assert store.put(key("a"), rows(0)) is False  # even with equal rows: the record already exists
    assert store.num_records == 1


def test_non_contiguous_input_is_stored_contiguously(store):
    big = np.zeros((BS, LAYERS, TOPK * 2), dtype=np.int16)
    big[..., ::2] = rows(3)
    view = big[..., ::2]
    assert not view.flags.c_contiguous
    store.put(key("v"), view)
    rec = store.get(key("v"))
    assert rec.flags.c_contiguous
    np.testing.assert_array_equal(rec, rows(3))


@pytest.mark.parametrize(
    ("bad", "exc", "match"),
    [
        (np.zeros((BS, LAYERS, TOPK), dtype=np.int32), TypeError, "int16"),
        (np.zeros((BS, LAYERS, TOPK), dtype=np.uint16), TypeError, "int16"),
        (np.zeros((BS - 1, LAYERS, TOPK), dtype=np.int16), ValueError, "shape"),
        (np.zeros((BS, LAYERS + 1, TOPK), dtype=np.int16), ValueError, "shape"),
        (np.zeros((BS, LAYERS, TOPK + 1), dtype=np.int16), ValueError, "shape"),
        (np.zeros((BS * LAYERS * TOPK,), dtype=np.int16), ValueError, "shape"),
        (np.zeros((BS, LAYERS, TOPK), dtype=np.int16).tolist(), TypeError, "numpy"),
    ],
)
def test_put_validates_shape_and_dtype(store, bad, exc, match):
    with pytest.raises(exc, match=match):
        store.put(key("a"), bad)
    assert store.num_records == 0


def test_put_validates_expert_values_when_n_experts_given(store):
    r = rows(0)
    r[1, 2, 0] = EXPERTS
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        store.put(key("a"), r)
    r = rows(0)
    r[2, 0, 0] = -1
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        store.put(key("a"), r)
    r = rows(0)
    r[3, 1, 1] = r[3, 1, 0]
    with pytest.raises(ValueError, match="twice"):
        store.put(key("a"), r)
    assert store.num_records == 0
    # Without n_experts only shape and dtype are checked.
    lax = RouteStore(BS, LAYERS, TOPK)
    assert lax.put(key("a"), np.zeros(SHAPE, dtype=np.int16))


def test_put_rejects_bad_key(store):
    with pytest.raises(ValueError):
        store.put(BlockKey(b"short"), rows(0))
    with pytest.raises(TypeError):
        store.put("a" * 32, rows(0))


@pytest.mark.parametrize(
    "args",
    [(0, LAYERS, TOPK), (BS, 0, TOPK), (BS, LAYERS, -1), (BS, LAYERS, TOPK, 1), (BS, LAYERS, TOPK, True)],
)
def test_constructor_validation(args):
    with pytest.raises(ValueError):
        RouteStore(*args)


# -- eviction and leases ------------------------------------------------------------------------


def test_eviction_without_lease_drops_now(store):
    store.put(key("a"), rows(0))
    store.on_block_evicted(key("a"))
    assert store.get(key("a")) is None and store.num_records == 0
    store.on_block_evicted(key("a"))  # no record: no-op
    store.on_block_evicted(key("never"))
    store.check_integrity()


def test_lease_keeps_record_after_eviction_until_release(store):
    store.put(key("a"), rows(0))
    store.lease([key("a")])
    store.lease([key("a")])  # two readers (e.g. two requests hitting the same prefix)
    assert store.lease_count(key("a")) == 2
    store.on_block_evicted(key("a"))
    assert store.is_pending_drop(key("a"))
    np.testing.assert_array_equal(store.get(key("a")), rows(0))  # still readable by leaseholders
    store.check_integrity()
    store.release([key("a")])
    np.testing.assert_array_equal(store.get(key("a")), rows(0))
    store.release([key("a")])
    assert store.get(key("a")) is None
    assert (store.num_records, store.num_pending_drop, store.lease_count(key("a"))) == (0, 0, 0)
    store.check_integrity()


def test_release_without_eviction_keeps_record(store):
    store.put(key("a"), rows(0))
    store.lease([key("a"), key("a")])
    store.release([key("a"), key("a")])
    np.testing.assert_array_equal(store.get(key("a")), rows(0))  # block still cached: record stays
    assert store.lease_count(key("a")) == 0
    store.check_integrity()


def test_lease_missing_key_raises_and_leases_nothing(store):
    store.put(key("a"), rows(0))
    with pytest.raises(KeyError):
        store.lease([key("a"), key("missing")])
    assert store.lease_count(key("a")) == 0


def test_over_release_raises_and_releases_nothing(store):
    store.put(key("a"), rows(0))
    store.put(key("b"), rows(1))
    store.lease([key("a"), key("b")])
    with pytest.raises(ValueError, match="lease"):
        store.release([key("a"), key("b"), key("b")])
    assert (store.lease_count(key("a")), store.lease_count(key("b"))) == (1, 1)
    with pytest.raises(ValueError):
        store.release([key("c")])


def test_recommit_with_equal_rows_revives_pending_drop(store):
    store.put(key("a"), rows(0))
    store.lease([key("a")])
    store.on_block_evicted(key("a"))
    # The block is recomputed and committed again (deterministic numerics: same routes).
    assert store.put(key("a"), rows(0)) is True
    assert not store.is_pending_drop(key("a"))
    store.release([key("a")])
    np.testing.assert_array_equal(store.get(key("a")), rows(0))  # survives the last release
    store.check_integrity()


def test_recommit_with_different_rows_keeps_old_record_pending(store):
    store.put(key("a"), rows(0))
    store.lease([key("a")])
    store.on_block_evicted(key("a"))
    # Nondeterministic recompute produced other routes: the leaseholder keeps its rows and the
    # caller learns it must not cache its block under this key.
    assert store.put(key("a"), rows(1)) is False
    assert store.is_pending_drop(key("a"))
    np.testing.assert_array_equal(store.get(key("a")), rows(0))
    store.release([key("a")])
    assert store.get(key("a")) is None
    assert store.put(key("a"), rows(1)) is True  # afterwards a fresh record can be stored
    np.testing.assert_array_equal(store.get(key("a")), rows(1))
    store.check_integrity()


def test_drop_under_lease_fault_injection(store):
    store.put(key("a"), rows(0))
    store.lease([key("a")])
    assert store.drop(key("a"))
    assert store.get(key("a")) is None
    store.check_integrity()
    store.release([key("a")])  # the lease is still accounted for and releases cleanly
    assert store.lease_count(key("a")) == 0
    store.check_integrity()


def test_keyed_by_block_key_not_slot():
    """The pool reuses slots; the store follows keys through the pool's eviction hook."""
    store = RouteStore(BS, LAYERS, TOPK, n_experts=EXPERTS)
    pool = BlockPool(2, on_evict=store.on_block_evicted)
    b0, b1 = pool.allocate(2)
    for b, name, seed in ((b0, "x", 0), (b1, "y", 1)):
        assert store.put(key(name), rows(seed))
        assert pool.commit(b, key(name))
    store.lease([key("x")])  # a request still owes x's rows
    pool.free([b1, b0])
    (slot,) = pool.allocate(1)  # reuses b1: y evicted, unleased -> gone
    assert slot == b1
    assert store.get(key("y")) is None and store.has(key("x"))
    (slot,) = pool.allocate(1)  # reuses b0: x evicted, but leased -> pending
    assert slot == b0
    assert store.is_pending_drop(key("x"))
    # x's KV is recomputed into the other slot and committed again: the record follows the key.
    assert store.put(key("x"), rows(0))
    assert pool.commit(b1, key("x"))
    store.release([key("x")])
    np.testing.assert_array_equal(store.get(key("x")), rows(0))
    pool.check_integrity()
    store.check_integrity()


# -- check_integrity catches corruption ---------------------------------------------------------


def test_integrity_catches_pending_without_lease(store):
    store.put(key("a"), rows(0))
    store._pending_drop.add(key("a"))
    with pytest.raises(AssertionError, match="leased"):
        store.check_integrity()


def test_integrity_catches_pending_without_record(store):
    store._pending_drop.add(key("a"))
    store._leases[key("a")] = 1
    with pytest.raises(AssertionError, match="have records"):
        store.check_integrity()


def test_integrity_catches_zero_lease_and_writable_record(store):
    store.put(key("a"), rows(0))
    store._leases[key("a")] = 0
    with pytest.raises(AssertionError, match="lease counts"):
        store.check_integrity()
    del store._leases[key("a")]
    store._records[key("a")] = rows(0)  # writable
    with pytest.raises(AssertionError, match="read-only"):
        store.check_integrity()
