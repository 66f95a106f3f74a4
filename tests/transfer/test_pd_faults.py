"""Fault injection on the prefill -> decode path: every fault is detected and named, and no
unverified block is ever reported as verified."""

from __future__ import annotations

import pytest
from pd_helpers import assert_blocks, failed, load
from transfer_harness import BLOCK_SIZE, routes_for

from execstate.transfer.errors import ErrorCode
from execstate_bench.faults import FaultInjection, FaultyImporter


def test_fault_drop_times_out_then_retry_succeeds(source, source_kv, receiver) -> None:
    exp = source.export("drop", 64, token_seed=4)
    imp = FaultyImporter(
        receiver.pool, receiver.caps, receiver.bulk, 0.5, FaultInjection.from_dict({"mode": "drop"})
    )
    result, _ = load(receiver, source.addr, "drop", exp.epoch, 64, 4, importer=imp)
    failed(result, ErrorCode.TIMEOUT)
    assert 0.5 <= result.elapsed_s < 2.0
    imp.faults = FaultInjection()  # the handshake is redone after the failure
    result, dst = load(receiver, source.addr, "drop", exp.epoch, 64, 4, importer=imp)
    assert result.ok, result.error
    assert_blocks(receiver, source_kv, dst, exp.block_ids)
    imp.close()


def test_fault_delay(source, receiver) -> None:
    exp = source.export("delay-ok", 32, token_seed=5)
    result, _ = load(
        receiver, source.addr, "delay-ok", exp.epoch, 32, 5, faults={"mode": "delay", "delay_s": 0.2}
    )
    assert result.ok and result.elapsed_s >= 0.2
    exp = source.export("delay-late", 32, token_seed=5)
    result, _ = load(
        receiver,
        source.addr,
        "delay-late",
        exp.epoch,
        32,
        5,
        timeout_s=0.3,
        faults={"mode": "delay", "delay_s": 0.6},
    )
    failed(result, ErrorCode.TIMEOUT)


def test_fault_corrupt_gives_verified_prefix(source, source_kv, receiver) -> None:
    exp = source.export("corrupt", 6 * BLOCK_SIZE, token_seed=6)
    result, dst = load(
        receiver, source.addr, "corrupt", exp.epoch, 6 * BLOCK_SIZE, 6, faults={"mode": "corrupt"}
    )
    assert not result.ok and result.error_code is ErrorCode.CHECKSUM_MISMATCH
    assert "block 3" in (result.error or "")
    assert result.num_blocks_verified == 3 and result.num_tokens == 3 * BLOCK_SIZE
    assert_blocks(receiver, source_kv, dst[:3], exp.block_ids[:3])
    assert result.routes is not None and (result.routes == routes_for(96, 6)[:48]).all()
    assert result.kv_bytes > 0


@pytest.mark.parametrize("what", ["blocks", "routes"])
def test_fault_truncate(source, receiver, what: str) -> None:
    exp = source.export(f"trunc-{what}", 4 * BLOCK_SIZE, token_seed=7)
    faults = {"mode": "truncate", "truncate": what}
    result, _ = load(receiver, source.addr, f"trunc-{what}", exp.epoch, 4 * BLOCK_SIZE, 7, faults=faults)
    failed(result, ErrorCode.TRUNCATED)
    assert result.kv_bytes == 0  # nothing was read for a manifest that failed verification


def test_fault_duplicate_second_load_fails_as_released(source, receiver) -> None:
    exp = source.export("dup", 32, token_seed=8)
    result, _ = load(receiver, source.addr, "dup", exp.epoch, 32, 8, faults={"mode": "duplicate"})
    failed(result, ErrorCode.RELEASED)
    assert ("dup", "released") in source.query().released  # the first load completed and released


def test_fault_stale_transfer_id(source, receiver) -> None:
    old = source.export("stale-old", 32, token_seed=9)
    new = source.export("stale-new", 32, token_seed=9)
    assert old.epoch == new.epoch
    # The source still serves the old transfer: the receiver's own check rejects it.
    faults = {"mode": "stale_transfer_id", "stale_id": "stale-old"}
    result, _ = load(receiver, source.addr, "stale-new", new.epoch, 32, 9, faults=faults)
    failed(result, ErrorCode.STALE_TRANSFER_ID)
    assert load(receiver, source.addr, "stale-old", old.epoch, 32, 9)[0].ok  # not released by the wrong load
    # Without an explicit id the importer replays its previous (released) id.
    imp = FaultyImporter(receiver.pool, receiver.caps, receiver.bulk, 3.0)
    assert load(receiver, source.addr, "stale-new", new.epoch, 32, 9, importer=imp)[0].ok
    third = source.export("stale-third", 32, token_seed=9)
    imp.faults = FaultInjection.from_dict({"mode": "stale_transfer_id"})
    result, _ = load(receiver, source.addr, "stale-third", third.epoch, 32, 9, importer=imp)
    failed(result, ErrorCode.RELEASED)
    imp.close()


def test_unknown_id_and_key_mismatch(source, receiver) -> None:
    result, _ = load(receiver, source.addr, "never-exported", 0, 32, 10)
    failed(result, ErrorCode.UNKNOWN_TRANSFER)
    exp = source.export("keys", 32, token_seed=11)
    result, _ = load(receiver, source.addr, "keys", exp.epoch, 32, 12)  # D computed other tokens' keys
    failed(result, ErrorCode.KEY_MISMATCH)
