"""Helpers of the two-process transfer tests (receiver side)."""

from __future__ import annotations

import torch
from transfer_harness import BLOCK_SIZE, keys_for

from execstate.transfer.errors import ErrorCode
from execstate.transfer.importer import KVImporter, LoadResult
from execstate_bench.faults import FaultInjection, FaultyImporter


def slots(b: int) -> slice:
    return slice(b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE)


def load(
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
        rx.pool.k[:, slots(b)] = float("nan")
        rx.pool.v[:, slots(b)] = float("nan")
    imp = importer or FaultyImporter(
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


def assert_blocks(rx, source_kv, dst: list[int], src: list[int]) -> None:
    k, v = source_kv
    for d, s in zip(dst, src, strict=True):
        assert torch.equal(rx.pool.k[:, slots(d)], k[:, slots(s)]), f"K of block {s} -> {d}"
        assert torch.equal(rx.pool.v[:, slots(d)], v[:, slots(s)]), f"V of block {s} -> {d}"


def failed(result: LoadResult, code: ErrorCode) -> None:
    assert not result.ok
    assert result.error_code is code, result.error
    assert result.error is not None and result.error.startswith(code.value)
    assert result.num_blocks_verified == 0 and result.routes is None and result.num_tokens == 0
