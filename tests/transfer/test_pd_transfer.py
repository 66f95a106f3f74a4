"""Prefill -> decode transfer between two real processes: NIXL bulk + ZeroMQ control.

The source process (P) exports blocks of its randomly filled pool; this process (D) loads them
into its own pool and compares bytes with an independent regeneration of P's pool.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pd_helpers import assert_blocks, failed, load
from transfer_harness import (
    BLOCK_SIZE,
    N_MOE_LAYERS,
    TOP_K,
    Invalidate,
    Poll,
    keys_for,
    make_caps,
    make_pool,
    routes_for,
)

from execstate.transfer.bulk import NixlBulk
from execstate.transfer.checks import block_checksums
from execstate.transfer.control import ControlClient
from execstate.transfer.errors import ErrorCode, TransferError
from execstate.transfer.importer import KVImporter


def test_roundtrip_128_blocks_bandwidth(source, source_kv, receiver) -> None:
    warm = source.export("warm", 2 * BLOCK_SIZE, token_seed=1)
    r, _ = load(receiver, source.addr, "warm", warm.epoch, 2 * BLOCK_SIZE, 1)
    assert r.ok, r.error

    n_tokens = 128 * BLOCK_SIZE
    reps = []
    for i in range(3):  # bulk channel alone: manifest via a plain client, then NIXL reads
        exp = source.export(f"bw{i}", n_tokens, token_seed=2)
        client = ControlClient(source.addr, 5.0)
        manifest = client.get_manifest(f"bw{i}", exp.epoch)
        dst = receiver.block_pool.allocate(128)
        t0 = time.perf_counter()
        receiver.bulk.read(manifest.agent_name, manifest.agent_metadata, manifest.block_addrs, dst)
        reps.append(time.perf_counter() - t0)
        assert_blocks(receiver, source_kv, [int(b) for b in dst], exp.block_ids)
        receiver.block_pool.free(reversed(dst))
        client.release(f"bw{i}")
        client.close()

    exp = source.export("big", n_tokens, token_seed=2)
    result, dst = load(receiver, source.addr, "big", exp.epoch, n_tokens, 2)
    assert result.ok, result.error
    t0 = time.perf_counter()
    block_checksums(receiver.pool, dst)
    hash_s = time.perf_counter() - t0
    exp2 = source.export("big-parallel-hash", n_tokens, token_seed=2)
    with ThreadPoolExecutor(2) as pool:
        imp = KVImporter(receiver.pool, receiver.caps, receiver.bulk, 5.0, hash_executor=pool)
        par, dst2 = load(receiver, source.addr, "big-parallel-hash", exp2.epoch, n_tokens, 2, importer=imp)
        imp.close()
    assert par.ok and par.num_blocks_verified == 128, par.error
    assert_blocks(receiver, source_kv, dst2, exp2.block_ids)
    assert result.num_blocks_verified == 128 and result.num_tokens == n_tokens
    assert_blocks(receiver, source_kv, dst, exp.block_ids)
    assert result.routes is not None and result.routes.dtype == np.int16
    assert result.routes.shape == (n_tokens, N_MOE_LAYERS, TOP_K)
    assert (result.routes == routes_for(n_tokens, 2)).all()
    assert result.kv_bytes == 128 * 2 * 8 * BLOCK_SIZE * 4 * 64 * 4
    ratio = result.control_bytes / result.kv_bytes
    gbps = result.kv_bytes / min(reps) / 1e9
    print(
        f"\n[transfer] 128 blocks: KV {result.kv_bytes / 1e6:.1f} MB, control {result.control_bytes} B "
        f"(ratio {ratio:.4%}), bulk read {min(reps) * 1e3:.1f} ms = {gbps:.2f} GB/s, "
        f"end-to-end load {result.elapsed_s * 1e3:.1f} ms (of which sha256 of the received bytes "
        f"{hash_s * 1e3:.1f} ms), with 2 hash threads {par.elapsed_s * 1e3:.1f} ms"
    )
    assert ratio < 0.01  # the manifest is small next to the KV it describes
    state = source.query()
    assert state.num_used == 0 and state.num_inflight == 0  # every pin released, nothing leaked


def test_partial_tail_and_start_block(source, source_kv, receiver) -> None:
    """48-token prompt: D has blocks 0-1 itself, loads [32, 47) from P (docs/contracts.md 5 table)."""
    exp = source.export("tail", 47, token_seed=3)
    result, dst = load(receiver, source.addr, "tail", exp.epoch, 47, 3, start_block=2)
    assert result.ok, result.error
    assert result.num_blocks_verified == 1 and result.num_tokens == 15
    assert_blocks(receiver, source_kv, dst, exp.block_ids[2:])
    assert result.routes is not None and result.routes.shape == (15, N_MOE_LAYERS, TOP_K)
    assert (result.routes == routes_for(47, 3)[32:47]).all()


def test_scattered_blocks_on_both_sides(source, source_kv, receiver) -> None:
    """Non-contiguous source and destination blocks: descriptors merge only where both sides run on."""
    source.export("pad", 3 * BLOCK_SIZE, token_seed=20)  # shifts the source's free queue
    exp = source.export("scatter", 9 * BLOCK_SIZE, token_seed=21)
    assert exp.error is None
    dst = [7, 3, 4, 5, 40, 41, 12, 0, 1]
    result, got = load(receiver, source.addr, "scatter", exp.epoch, 9 * BLOCK_SIZE, 21, dst=dst)
    assert result.ok, result.error
    assert_blocks(receiver, source_kv, got, exp.block_ids)


def test_capability_mismatch(source, receiver) -> None:
    exp = source.export("caps", 32, token_seed=13)
    other_weights = make_caps("D0", receiver.pool, weights_version="w2")
    result, _ = load(receiver, source.addr, "caps", exp.epoch, 32, 13, caps=other_weights)
    failed(result, ErrorCode.INCOMPATIBLE)
    assert "provenance digest" in (result.error or "")

    no_r3 = make_caps("D0", receiver.pool, r3=False)
    result, _ = load(receiver, source.addr, "caps", exp.epoch, 32, 13, caps=no_r3)
    failed(result, ErrorCode.INCOMPATIBLE)
    assert "R3 is absent on the local side" in (result.error or "")

    exp2 = source.export("caps-noroutes", 32, token_seed=13, with_routes=False)
    result, _ = load(receiver, source.addr, "caps-noroutes", exp2.epoch, 32, 13)
    failed(result, ErrorCode.INCOMPATIBLE)
    assert "manifest carries none" in (result.error or "")
    exp3 = source.export("caps-noroutes-2", 32, token_seed=13, with_routes=False)
    result, _ = load(receiver, source.addr, "caps-noroutes-2", exp3.epoch, 32, 13, need_routes=False)
    assert result.ok and result.routes is None  # KV alone is fine when routes are not returned

    pool = make_pool(8, head_dim=32)  # another layout
    bulk = NixlBulk(pool, "D1-nixl", timeout_s=5.0)
    imp = KVImporter(pool, make_caps("D1", pool), bulk, 3.0)
    keys = keys_for(32, 13)
    result = imp.load(source.addr, "caps", exp.epoch, keys, [0, 1], need_routes=True)
    failed(result, ErrorCode.INCOMPATIBLE)
    assert "KV layout" in (result.error or "")
    imp.close()
    bulk.close()


def test_limits_and_release(source, receiver) -> None:
    source.setup(max_inflight=2)
    a = source.export("lim-a", 32, token_seed=14)
    b = source.export("lim-b", 32, token_seed=14)
    c = source.export("lim-c", 32, token_seed=14)
    assert a.error is None and b.error is None
    assert c.error is not None and c.error.startswith("limit")
    assert source.query().num_used == 4  # c pinned nothing
    assert load(receiver, source.addr, "lim-a", a.epoch, 32, 14)[0].ok  # in-flight ones finish
    assert source.export("lim-d", 32, token_seed=14).error is None  # room again after the release
    assert load(receiver, source.addr, "lim-b", b.epoch, 32, 14)[0].ok
    assert load(receiver, source.addr, "lim-d", b.epoch, 32, 14)[0].ok
    state = source.query()
    assert state.num_used == 0 and state.stats["rejected"] == 1 and state.stats["released"] == 3

    block_bytes = 2 * 8 * BLOCK_SIZE * 4 * 64 * 4
    source.setup(max_bytes=3 * block_bytes + 3 * 512)
    assert source.export("mb-a", 32, token_seed=15).error is None
    big = source.export("mb-b", 32, token_seed=15)
    assert big.error is not None and "limit" in big.error
    assert source.export("mb-c", 16, token_seed=15).error is None
    assert source.query().num_used == 3


def test_ttl_expiry_releases_blocks(source, receiver) -> None:
    source.setup(ttl_s=0.4)
    exp = source.export("ttl", 64, token_seed=16)
    assert source.query().num_used == 4
    time.sleep(0.6)
    result, _ = load(receiver, source.addr, "ttl", exp.epoch, 64, 16)
    failed(result, ErrorCode.EXPIRED)
    state = source.query()
    assert state.num_used == 0 and ("ttl", "expired") in state.released

    source.setup(ttl_s=60.0)
    source.export("ttl-2", 32, token_seed=16)
    source.call(Poll(advance_s=120.0))  # the engine's clock passed the TTL
    state = source.query()
    assert state.num_used == 0 and ("ttl-2", "expired") in state.released


def test_stale_epoch_after_invalidate_all(source, source_kv, receiver) -> None:
    old = source.export("ep-old", 32, token_seed=17)
    new_epoch = source.call(Invalidate())
    assert new_epoch == old.epoch + 1
    result, _ = load(receiver, source.addr, "ep-old", old.epoch, 32, 17)
    failed(result, ErrorCode.INVALIDATED)
    late = source.export("ep-late", 32, token_seed=17, epoch=old.epoch)  # computed before the update
    assert late.error is not None and late.error.startswith("stale_epoch")
    cur = source.export("ep-new", 32, token_seed=17)
    assert cur.epoch == new_epoch
    result, _ = load(receiver, source.addr, "ep-new", old.epoch, 32, 17)  # handoff with the old epoch
    failed(result, ErrorCode.STALE_EPOCH)
    result, dst = load(receiver, source.addr, "ep-new", cur.epoch, 32, 17)
    assert result.ok, result.error
    assert_blocks(receiver, source_kv, dst, cur.block_ids)
    assert source.query().num_used == 0


def test_killed_source_fails_in_time(doomed_source, receiver) -> None:
    src = doomed_source
    try:
        first = src.export("k1", 32, token_seed=18)
        second = src.export("k2", 32, token_seed=18)
        third = src.export("k3", 32, token_seed=18)
        imp = KVImporter(receiver.pool, receiver.caps, receiver.bulk, 1.0)
        assert load(receiver, src.addr, "k1", first.epoch, 32, 18, importer=imp)[0].ok
        client = ControlClient(src.addr, 2.0)
        manifest = client.get_manifest("k3", third.epoch)
        src.kill()
        result, _ = load(receiver, src.addr, "k2", second.epoch, 32, 18, importer=imp)
        failed(result, ErrorCode.TIMEOUT)
        assert result.elapsed_s < 2.0
        # The bulk channel towards the dead agent fails too, without hanging.
        dst = receiver.block_pool.allocate(2)
        t0 = time.monotonic()
        with pytest.raises(TransferError) as err:
            receiver.bulk.read(manifest.agent_name, manifest.agent_metadata, manifest.block_addrs, dst)
        assert err.value.code in (ErrorCode.BULK, ErrorCode.TIMEOUT)
        assert time.monotonic() - t0 < receiver.bulk.timeout_s + 1.0
        receiver.block_pool.free(dst)
        imp.close()
        client.close()
    finally:
        src.stop()
