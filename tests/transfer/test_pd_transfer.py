"""Prefill -> decode transfer between two real processes: NIXL bulk + ZeroMQ control.

The source process (P) exports blocks of its randomly filled pool; this process (D) loads them
into its own pool and compares bytes with an independent regeneration of P's pool.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from transfer_harness import (
    BLOCK_SIZE,
    N_MOE_LAYERS,
    TOP_K,
    Invalidate,
    Poll,
    Source,
    SourceConfig,
    keys_for,
    make_caps,
    make_pool,
    routes_for,
)

from execstate.state.block_pool import BlockPool
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.control import ControlClient
from execstate.transfer.errors import ErrorCode, TransferError
from execstate.transfer.faults import FaultInjection
from execstate.transfer.importer import KVImporter, LoadResult


def _slots(b: int) -> slice:
    return slice(b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE)


def _load(
    rx,
    addr: str,
    transfer_id: str,
    epoch: int,
    num_tokens: int,
    token_seed: int,
    *,
    faults: dict | None = None,
    timeout_s: float = 3.0,
    need_routes: bool = True,
    start_block: int = 0,
    caps=None,
    importer: KVImporter | None = None,
    dst: list[int] | None = None,
) -> tuple[LoadResult, list[int]]:
    keys = keys_for(num_tokens, token_seed)[start_block:]
    owned = dst is None  # else the test chose the blocks (no allocation bookkeeping)
    dst = rx.block_pool.allocate(len(keys)) if dst is None else list(dst)
    for b in dst:  # stale bytes from an earlier test must not pass as loaded
        rx.pool.k[:, _slots(b)] = float("nan")
        rx.pool.v[:, _slots(b)] = float("nan")
    imp = importer or KVImporter(
        rx.pool, caps or rx.caps, rx.bulk, timeout_s, FaultInjection.from_dict(faults)
    )
    try:
        result = imp.load(addr, transfer_id, epoch, keys, dst, need_routes, start_block=start_block)
    finally:
        if owned:
            rx.block_pool.free(reversed(dst))
        if importer is None:
            imp.close()
    return result, [int(b) for b in dst]


def _assert_blocks(rx, source_kv, dst: list[int], src: list[int]) -> None:
    k, v = source_kv
    for d, s in zip(dst, src, strict=True):
        assert torch.equal(rx.pool.k[:, _slots(d)], k[:, _slots(s)]), f"K of block {s} -> {d}"
        assert torch.equal(rx.pool.v[:, _slots(d)], v[:, _slots(s)]), f"V of block {s} -> {d}"


def _failed(result: LoadResult, code: ErrorCode) -> None:
    assert not result.ok
    assert result.error_code is code, result.error
    assert result.error is not None and result.error.startswith(code.value)
    assert result.num_blocks_verified == 0 and result.routes is None and result.num_tokens == 0


def test_roundtrip_128_blocks_bandwidth(source, source_kv, receiver) -> None:
    source.setup()
    warm = source.export("warm", 2 * BLOCK_SIZE, token_seed=1)
    r, _ = _load(receiver, source.addr, "warm", warm.epoch, 2 * BLOCK_SIZE, 1)
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
        _assert_blocks(receiver, source_kv, [int(b) for b in dst], exp.block_ids)
        receiver.block_pool.free(reversed(dst))
        client.release(f"bw{i}")
        client.close()

    exp = source.export("big", n_tokens, token_seed=2)
    result, dst = _load(receiver, source.addr, "big", exp.epoch, n_tokens, 2)
    assert result.ok, result.error
    assert result.num_blocks_verified == 128 and result.num_tokens == n_tokens
    _assert_blocks(receiver, source_kv, dst, exp.block_ids)
    assert result.routes is not None and result.routes.dtype == np.int16
    assert result.routes.shape == (n_tokens, N_MOE_LAYERS, TOP_K)
    assert (result.routes == routes_for(n_tokens, 2)).all()
    assert result.kv_bytes == 128 * 2 * 8 * BLOCK_SIZE * 4 * 64 * 4
    ratio = result.control_bytes / result.kv_bytes
    gbps = result.kv_bytes / min(reps) / 1e9
    print(
        f"\n[transfer] 128 blocks: KV {result.kv_bytes / 1e6:.1f} MB, control {result.control_bytes} B "
        f"(ratio {ratio:.4%}), bulk read {min(reps) * 1e3:.1f} ms = {gbps:.2f} GB/s, "
        f"end-to-end load {result.elapsed_s * 1e3:.1f} ms = {result.kv_bytes / result.elapsed_s / 1e9:.2f} GB/s"
    )
    assert ratio < 0.01  # the manifest is small next to the KV it describes
    state = source.query()
    assert state.num_used == 0 and state.num_inflight == 0  # every pin released, nothing leaked


def test_partial_tail_and_start_block(source, source_kv, receiver) -> None:
    """48-token prompt: D has blocks 0-1 itself, loads [32, 47) from P (DESIGN.md 5 table)."""
    exp = source.export("tail", 47, token_seed=3)
    result, dst = _load(receiver, source.addr, "tail", exp.epoch, 47, 3, start_block=2)
    assert result.ok, result.error
    assert result.num_blocks_verified == 1 and result.num_tokens == 15
    _assert_blocks(receiver, source_kv, dst, exp.block_ids[2:])
    assert result.routes is not None and result.routes.shape == (15, N_MOE_LAYERS, TOP_K)
    assert (result.routes == routes_for(47, 3)[32:47]).all()


def test_scattered_blocks_on_both_sides(source, source_kv, receiver) -> None:
    """Non-contiguous source and destination blocks: descriptors merge only where both sides run on."""
    source.setup()
    source.export("pad", 3 * BLOCK_SIZE, token_seed=20)  # shifts the source's free queue
    exp = source.export("scatter", 9 * BLOCK_SIZE, token_seed=21)
    assert exp.error is None
    dst = [7, 3, 4, 5, 40, 41, 12, 0, 1]
    result, got = _load(receiver, source.addr, "scatter", exp.epoch, 9 * BLOCK_SIZE, 21, dst=dst)
    assert result.ok, result.error
    _assert_blocks(receiver, source_kv, got, exp.block_ids)


def test_fault_drop_times_out_then_retry_succeeds(source, source_kv, receiver) -> None:
    exp = source.export("drop", 64, token_seed=4)
    imp = KVImporter(
        receiver.pool, receiver.caps, receiver.bulk, 0.5, FaultInjection.from_dict({"mode": "drop"})
    )
    result, _ = _load(receiver, source.addr, "drop", exp.epoch, 64, 4, importer=imp)
    _failed(result, ErrorCode.TIMEOUT)
    assert 0.5 <= result.elapsed_s < 2.0
    imp.faults = FaultInjection()  # the handshake is redone after the failure
    result, dst = _load(receiver, source.addr, "drop", exp.epoch, 64, 4, importer=imp)
    assert result.ok, result.error
    _assert_blocks(receiver, source_kv, dst, exp.block_ids)
    imp.close()


def test_fault_delay(source, receiver) -> None:
    exp = source.export("delay-ok", 32, token_seed=5)
    result, _ = _load(
        receiver, source.addr, "delay-ok", exp.epoch, 32, 5, faults={"mode": "delay", "delay_s": 0.2}
    )
    assert result.ok and result.elapsed_s >= 0.2
    exp = source.export("delay-late", 32, token_seed=5)
    result, _ = _load(
        receiver,
        source.addr,
        "delay-late",
        exp.epoch,
        32,
        5,
        timeout_s=0.3,
        faults={"mode": "delay", "delay_s": 0.6},
    )
    _failed(result, ErrorCode.TIMEOUT)


def test_fault_corrupt_gives_verified_prefix(source, source_kv, receiver) -> None:
    exp = source.export("corrupt", 6 * BLOCK_SIZE, token_seed=6)
    result, dst = _load(
        receiver, source.addr, "corrupt", exp.epoch, 6 * BLOCK_SIZE, 6, faults={"mode": "corrupt"}
    )
    assert not result.ok and result.error_code is ErrorCode.CHECKSUM_MISMATCH
    assert "block 3" in (result.error or "")
    assert result.num_blocks_verified == 3 and result.num_tokens == 3 * BLOCK_SIZE
    _assert_blocks(receiver, source_kv, dst[:3], exp.block_ids[:3])
    assert result.routes is not None and (result.routes == routes_for(96, 6)[:48]).all()
    assert result.kv_bytes > 0


@pytest.mark.parametrize("what", ["blocks", "routes"])
def test_fault_truncate(source, receiver, what: str) -> None:
    exp = source.export(f"trunc-{what}", 4 * BLOCK_SIZE, token_seed=7)
    faults = {"mode": "truncate", "truncate": what}
    result, _ = _load(receiver, source.addr, f"trunc-{what}", exp.epoch, 4 * BLOCK_SIZE, 7, faults=faults)
    _failed(result, ErrorCode.TRUNCATED)
    assert result.kv_bytes == 0  # nothing was read for a manifest that failed verification


def test_fault_duplicate_second_load_fails_as_released(source, receiver) -> None:
    exp = source.export("dup", 32, token_seed=8)
    result, _ = _load(receiver, source.addr, "dup", exp.epoch, 32, 8, faults={"mode": "duplicate"})
    _failed(result, ErrorCode.RELEASED)
    assert ("dup", "released") in source.query().released  # the first load completed and released


def test_fault_stale_transfer_id(source, receiver) -> None:
    old = source.export("stale-old", 32, token_seed=9)
    new = source.export("stale-new", 32, token_seed=9)
    assert old.epoch == new.epoch
    # The source still serves the old transfer: the receiver's own check rejects it.
    faults = {"mode": "stale_transfer_id", "stale_id": "stale-old"}
    result, _ = _load(receiver, source.addr, "stale-new", new.epoch, 32, 9, faults=faults)
    _failed(result, ErrorCode.STALE_TRANSFER_ID)
    # Without an explicit id the importer replays its previous (released) id.
    imp = KVImporter(receiver.pool, receiver.caps, receiver.bulk, 3.0)
    assert _load(receiver, source.addr, "stale-new", new.epoch, 32, 9, importer=imp)[0].ok
    third = source.export("stale-third", 32, token_seed=9)
    imp.faults = FaultInjection.from_dict({"mode": "stale_transfer_id"})
    result, _ = _load(receiver, source.addr, "stale-third", third.epoch, 32, 9, importer=imp)
    _failed(result, ErrorCode.RELEASED)
    imp.close()


def test_unknown_id_and_key_mismatch(source, receiver) -> None:
    result, _ = _load(receiver, source.addr, "never-exported", 0, 32, 10)
    _failed(result, ErrorCode.UNKNOWN_TRANSFER)
    exp = source.export("keys", 32, token_seed=11)
    result, _ = _load(receiver, source.addr, "keys", exp.epoch, 32, 12)  # D computed other tokens' keys
    _failed(result, ErrorCode.KEY_MISMATCH)


def test_capability_mismatch(source, receiver) -> None:
    exp = source.export("caps", 32, token_seed=13)
    other_weights = make_caps("D0", receiver.pool, weights_version="w2")
    result, _ = _load(receiver, source.addr, "caps", exp.epoch, 32, 13, caps=other_weights)
    _failed(result, ErrorCode.INCOMPATIBLE)
    assert "provenance digest" in (result.error or "")

    no_r3 = make_caps("D0", receiver.pool, r3=False)
    result, _ = _load(receiver, source.addr, "caps", exp.epoch, 32, 13, caps=no_r3)
    _failed(result, ErrorCode.INCOMPATIBLE)
    assert "R3 is absent on the local side" in (result.error or "")

    exp2 = source.export("caps-noroutes", 32, token_seed=13, with_routes=False)
    result, _ = _load(receiver, source.addr, "caps-noroutes", exp2.epoch, 32, 13)
    _failed(result, ErrorCode.INCOMPATIBLE)
    assert "manifest carries none" in (result.error or "")
    exp3 = source.export("caps-noroutes-2", 32, token_seed=13, with_routes=False)
    result, _ = _load(receiver, source.addr, "caps-noroutes-2", exp3.epoch, 32, 13, need_routes=False)
    assert result.ok and result.routes is None  # KV alone is fine when routes are not returned

    pool = make_pool(8, head_dim=32)  # another layout
    bulk = NixlBulk(pool, "D1-nixl", timeout_s=5.0)
    imp = KVImporter(pool, make_caps("D1", pool), bulk, 3.0)
    keys = keys_for(32, 13)
    result = imp.load(source.addr, "caps", exp.epoch, keys, [0, 1], need_routes=True)
    _failed(result, ErrorCode.INCOMPATIBLE)
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
    assert _load(receiver, source.addr, "lim-a", a.epoch, 32, 14)[0].ok  # in-flight ones finish
    assert source.export("lim-d", 32, token_seed=14).error is None  # room again after the release
    assert _load(receiver, source.addr, "lim-b", b.epoch, 32, 14)[0].ok
    assert _load(receiver, source.addr, "lim-d", b.epoch, 32, 14)[0].ok
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
    result, _ = _load(receiver, source.addr, "ttl", exp.epoch, 64, 16)
    _failed(result, ErrorCode.EXPIRED)
    state = source.query()
    assert state.num_used == 0 and ("ttl", "expired") in state.released

    source.setup(ttl_s=60.0)
    source.export("ttl-2", 32, token_seed=16)
    source.call(Poll(advance_s=120.0))  # the engine's clock passed the TTL
    state = source.query()
    assert state.num_used == 0 and ("ttl-2", "expired") in state.released


def test_stale_epoch_after_invalidate_all(source, source_kv, receiver) -> None:
    source.setup()
    old = source.export("ep-old", 32, token_seed=17)
    new_epoch = source.call(Invalidate())
    assert new_epoch == old.epoch + 1
    result, _ = _load(receiver, source.addr, "ep-old", old.epoch, 32, 17)
    _failed(result, ErrorCode.INVALIDATED)
    late = source.export("ep-late", 32, token_seed=17, epoch=old.epoch)  # computed before the update
    assert late.error is not None and late.error.startswith("stale_epoch")
    cur = source.export("ep-new", 32, token_seed=17)
    assert cur.epoch == new_epoch
    result, _ = _load(receiver, source.addr, "ep-new", old.epoch, 32, 17)  # handoff with the old epoch
    _failed(result, ErrorCode.STALE_EPOCH)
    result, dst = _load(receiver, source.addr, "ep-new", cur.epoch, 32, 17)
    assert result.ok, result.error
    _assert_blocks(receiver, source_kv, dst, cur.block_ids)
    assert source.query().num_used == 0


def test_killed_source_fails_in_time(receiver) -> None:
    src = Source(SourceConfig(instance_id="P-kill"))
    try:
        first = src.export("k1", 32, token_seed=18)
        second = src.export("k2", 32, token_seed=18)
        third = src.export("k3", 32, token_seed=18)
        imp = KVImporter(receiver.pool, receiver.caps, receiver.bulk, 1.0)
        assert _load(receiver, src.addr, "k1", first.epoch, 32, 18, importer=imp)[0].ok
        client = ControlClient(src.addr, 2.0)
        manifest = client.get_manifest("k3", third.epoch)
        src.kill()
        result, _ = _load(receiver, src.addr, "k2", second.epoch, 32, 18, importer=imp)
        _failed(result, ErrorCode.TIMEOUT)
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


def test_receiver_pool_state_is_clean(receiver) -> None:
    receiver.block_pool.check_integrity()
    assert receiver.block_pool.num_used == 0
    assert isinstance(receiver.block_pool, BlockPool) and receiver.bulk.num_stuck == 0
