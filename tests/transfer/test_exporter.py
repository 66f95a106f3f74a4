"""KVExporter state machine in one process: pins, snapshots, limits, TTL, release, epochs."""

from __future__ import annotations

import numpy as np
import pytest
from transfer_harness import BLOCK_SIZE, fill_pool, keys_for, make_caps, make_pool, routes_for

from execstate.state.block_pool import BlockPool
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.checks import block_checksums
from execstate.transfer.control import Ack, ErrorReply, GetManifest, Hello, HelloReply, Release
from execstate.transfer.errors import ErrorCode, TransferError, TransferLimitError
from execstate.transfer.exporter import KVExporter, Released, ReleaseReason
from execstate.transfer.manifest import Manifest

BLOCK_BYTES = 2 * 8 * BLOCK_SIZE * 4 * 64 * 4
ROUTE_BYTES = BLOCK_SIZE * 8 * 2 * 2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def parts():
    pool = make_pool(32)
    fill_pool(pool, 7)
    bulk = NixlBulk(pool, "exporter-unit")
    yield pool, bulk
    bulk.close()


def _exporter(parts, **kw) -> tuple[KVExporter, BlockPool, Clock]:
    pool, bulk = parts
    bp = BlockPool(32)
    clock = Clock()
    args = {"max_inflight": 8, "max_bytes": 1 << 30, "ttl_s": 10.0} | kw
    return KVExporter(pool, bp, make_caps("P", pool), bulk, clock=clock, **args), bp, clock


def _export(
    exp: KVExporter, bp: BlockPool, tid: str, num_tokens: int, seed: int = 0, routes: bool = True
) -> list[int]:
    """A request computes ``num_tokens`` tokens, exports them, then drops its own references."""
    ids = bp.allocate(-(-num_tokens // BLOCK_SIZE))
    try:
        exp.export(
            tid,
            exp.epoch,
            ids,
            keys_for(num_tokens, seed),
            routes_for(num_tokens, seed) if routes else None,
            num_tokens,
        )
    finally:
        bp.free(reversed(ids))
    return ids


def test_export_snapshots_an_immutable_manifest(parts) -> None:
    pool, bulk = parts
    exp, bp, _ = _exporter(parts)
    ids = _export(exp, bp, "t1", 40, seed=1)
    assert bp.num_used == 3 and exp.num_inflight == 1
    assert exp.inflight_bytes == 3 * BLOCK_BYTES + 3 * ROUTE_BYTES
    assert isinstance(exp.on_hello(Hello(exp.caps)), HelloReply)
    m = exp.on_get_manifest(GetManifest("t1", 0))
    assert isinstance(m, Manifest)
    assert [b.checksum for b in m.blocks] == block_checksums(pool, ids)
    assert [b.key for b in m.blocks] == keys_for(40, 1)
    assert m.block_addrs == bulk.block_addrs(ids) and m.agent_name == "exporter-unit"
    assert m.agent_metadata == bulk.metadata() and m.num_tokens == 40 and m.epoch == 0
    routes = np.concatenate([np.frombuffer(b.routes, dtype=np.int16) for b in m.blocks]).reshape(48, 8, 2)
    assert (routes[:40] == routes_for(40, 1)).all() and (routes[40:] == 0).all()  # tail rows are padding
    exp.check_integrity()


def test_release_is_queued_then_applied_by_poll(parts) -> None:
    exp, bp, _ = _exporter(parts)
    _export(exp, bp, "t1", 32)
    assert isinstance(exp.on_release(Release("t1")), Ack)
    reply = exp.on_get_manifest(GetManifest("t1", 0))
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.RELEASED
    assert bp.num_used == 2  # the control thread never touches the block pool
    exp.check_integrity()
    assert exp.poll() == [Released("t1", ReleaseReason.RELEASED, 2)]
    assert bp.num_used == 0 and exp.num_inflight == 0 and exp.inflight_bytes == 0
    assert isinstance(exp.on_release(Release("t1")), Ack)  # idempotent
    assert exp.poll() == []
    unknown = exp.on_release(Release("nope"))
    assert isinstance(unknown, ErrorReply) and unknown.code is ErrorCode.UNKNOWN_TRANSFER
    assert exp.stats.released == 1 and exp.stats.manifests_served == 0
    exp.check_integrity()
    bp.check_integrity()


def test_limits_reject_without_pinning(parts) -> None:
    exp, bp, _ = _exporter(parts, max_inflight=2, max_bytes=5 * (BLOCK_BYTES + ROUTE_BYTES))
    _export(exp, bp, "a", 32)
    _export(exp, bp, "b", 32)
    with pytest.raises(TransferLimitError, match="^limit: 2 transfers"):
        _export(exp, bp, "c", 16)
    assert bp.num_used == 4 and exp.stats.rejected == 1
    exp.on_release(Release("a"))
    exp.poll()
    with pytest.raises(TransferLimitError):  # 2 + 4 blocks > 5 blocks of bytes
        _export(exp, bp, "d", 64)
    _export(exp, bp, "e", 48)  # exactly at the byte limit
    assert exp.inflight_bytes == exp.max_bytes and bp.num_used == 5
    exp.check_integrity()


def test_ttl_expiry(parts) -> None:
    exp, bp, clock = _exporter(parts, ttl_s=5.0)
    _export(exp, bp, "t1", 32)
    clock.now += 5.0
    reply = exp.on_get_manifest(GetManifest("t1", 0))
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.EXPIRED  # before the engine polls
    assert exp.poll() == [Released("t1", ReleaseReason.EXPIRED, 2)]
    assert bp.num_used == 0 and exp.stats.expired == 1
    reply = exp.on_get_manifest(GetManifest("t1", 0))
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.EXPIRED
    _export(exp, bp, "t2", 32)
    assert (
        exp.poll(now=clock.now + 4.9) == []
        and exp.poll(now=clock.now + 5.0)[0].reason is ReleaseReason.EXPIRED
    )


def test_invalidate_all_bumps_the_epoch(parts) -> None:
    exp, bp, _ = _exporter(parts)
    _export(exp, bp, "t1", 32)
    _export(exp, bp, "t2", 16)
    released = exp.invalidate_all()
    assert {r.transfer_id for r in released} == {"t1", "t2"} and bp.num_used == 0 and exp.epoch == 1
    reply = exp.on_get_manifest(GetManifest("t1", 0))
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.INVALIDATED
    ids = bp.allocate(1)
    with pytest.raises(TransferError, match="^stale_epoch"):  # computed under the old weights
        exp.export("t3", 0, ids, keys_for(16, 0), None, 16)
    assert bp.num_used == 1
    exp.export("t3", 1, ids, keys_for(16, 0), None, 16)
    bp.free(ids)
    reply = exp.on_get_manifest(GetManifest("t3", 0))
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.STALE_EPOCH
    assert isinstance(exp.on_get_manifest(GetManifest("t3", 1)), Manifest)
    exp.check_integrity()


def test_bad_arguments_pin_nothing(parts) -> None:
    exp, bp, _ = _exporter(parts)
    ids = bp.allocate(2)
    keys = keys_for(32, 0)
    bad = [
        ("", ids, keys, None, 32),
        ("x", ids, keys[:1], None, 32),
        ("x", ids, keys, None, 33),
        ("x", ids, keys, routes_for(32, 0).astype(np.int32), 32),
        ("x", ids, keys, routes_for(20, 0), 32),
        ("x", [ids[0], 99], keys, None, 32),
        ("x", [ids[0], 30], keys, None, 32),  # block 30 is free and uncached
    ]
    for tid, blocks, ks, routes, n in bad:
        with pytest.raises(ValueError):
            exp.export(tid, 0, blocks, ks, routes, n)
        assert bp.num_used == 2 and exp.num_inflight == 0
    exp.export("x", 0, ids, keys, None, 32)
    with pytest.raises(ValueError, match="already exported"):
        exp.export("x", 0, ids, keys, None, 32)
    bp.free(ids)
    exp.check_integrity()


def test_check_integrity_catches_a_stolen_pin(parts) -> None:
    exp, bp, _ = _exporter(parts)
    ids = _export(exp, bp, "t1", 32)
    bp.free([ids[0]])  # someone drops the exporter's reference behind its back
    with pytest.raises(AssertionError, match=f"block {ids[0]} pinned"):
        exp.check_integrity()
