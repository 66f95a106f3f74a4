"""Checks every move of state passes before it is committed (docs/contracts.md 5: handshake, commit).

- :func:`check_compatible`: the handshake; two instances may exchange state only if they agree
  on format version, provenance (weights version, model, dtype, numerics), KV
  layout, bulk transport and, when routes are needed, both capture routes in the same format.
- :func:`verify_manifest`: a received manifest is for the transfer and epoch the receiver asked
  for, lists exactly the keys the receiver computed itself from its own provenance and tokens, and
  is internally consistent (counts, sizes, route record lengths).
- :func:`block_checksum`: the checksum (BLAKE3) of one block's KV bytes, the per-unit integrity check computed by
  the source at export and recomputed by the receiver on the bytes it received.

Every failure raises :class:`TransferError` whose code and message name the mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import cast

import numpy as np
import torch

from execstate.identity.checksum import checksum_parts
from execstate.identity.keys import BlockKey
from execstate.state.kv_pool import KVPool
from execstate.transfer.errors import ErrorCode, TransferError
from execstate.transfer.manifest import FORMAT_VERSION, ITEMSIZE, Capabilities, KVDType, KVLayout, Manifest

_PARALLEL_CHUNK = 16  # blocks per task when hashing on an executor


def kv_layout_of(pool: KVPool) -> KVLayout:
    """The :class:`KVLayout` of ``pool`` (``ValueError`` for a dtype the wire format lacks)."""
    dtype = str(pool.k.dtype).removeprefix("torch.")
    if dtype not in ITEMSIZE:
        raise ValueError(f"KV dtype {dtype} is not transferable; supported: {sorted(ITEMSIZE)}")
    _, _, num_kv_heads, head_dim = pool.k.shape
    return KVLayout(
        num_layers=pool.num_layers,
        block_size=pool.block_size,
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        dtype=cast(KVDType, dtype),  # one of ITEMSIZE's, checked above
    )


def _byte_view(t: torch.Tensor) -> np.ndarray:
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("block checksums need a contiguous CPU KV pool")
    return t.view(torch.uint8).numpy()  # zero-copy


def block_checksums(pool: KVPool, block_ids: Sequence[int], executor: Executor | None = None) -> list[bytes]:
    """The checksum (``identity/checksum.py``) of each block's KV bytes: K then V of layer 0, K
    then V of layer 1, ... (the order an offload unit's ``kv_checksum`` covers too).

    Zero-copy: hashes views of the pool. The order is the order of ``Manifest.block_addrs``.
    With ``executor`` the blocks are hashed in parallel chunks (BLAKE3 releases the GIL on large
    buffers); the result is the same. ``ValueError`` for an out-of-range block id.
    """
    for b in block_ids:
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < pool.num_blocks:
            raise ValueError(f"invalid block id {b!r} for a pool of {pool.num_blocks}")
    k, v = _byte_view(pool.k), _byte_view(pool.v)
    bs = pool.block_size

    def run(ids: Sequence[int]) -> list[bytes]:
        out: list[bytes] = []
        for b in ids:
            parts: list[np.ndarray] = []
            for layer in range(pool.num_layers):
                parts += (k[layer, b * bs : (b + 1) * bs], v[layer, b * bs : (b + 1) * bs])
            out.append(checksum_parts(parts))
        return out

    if executor is None or len(block_ids) < 2 * _PARALLEL_CHUNK:
        return run(block_ids)
    chunks = [block_ids[i : i + _PARALLEL_CHUNK] for i in range(0, len(block_ids), _PARALLEL_CHUNK)]
    return [c for part in executor.map(run, chunks) for c in part]


def block_checksum(pool: KVPool, block_id: int) -> bytes:
    """The checksum of one block's KV bytes (see :func:`block_checksums`)."""
    return block_checksums(pool, [block_id])[0]


def _incompatible(detail: str) -> TransferError:
    return TransferError(ErrorCode.INCOMPATIBLE, detail)


def check_compatible(local: Capabilities, remote: Capabilities, need_routes: bool) -> None:
    """Raise ``TransferError(INCOMPATIBLE)`` naming the first mismatch between two instances.

    R3 present on one side only fails only when ``need_routes`` (the request returns routes); a
    route format mismatch fails whenever both sides have one (it means another model).
    """
    if remote.format_version != local.format_version:
        raise _incompatible(f"format version: remote {remote.format_version}, local {local.format_version}")
    if remote.provenance_digest != local.provenance_digest:
        raise _incompatible(
            "provenance digest (weights version, model, dtype, numerics, route mode or cache salt) "
            f"differs: remote {remote.provenance_digest[:16]}, local {local.provenance_digest[:16]}"
        )
    if remote.kv_layout != local.kv_layout:
        raise _incompatible(f"KV layout: remote {remote.kv_layout}, local {local.kv_layout}")
    if remote.bulk != local.bulk:
        raise _incompatible(f"bulk transport: remote {remote.bulk!r}, local {local.bulk!r}")
    if remote.r3 is not None and local.r3 is not None and remote.r3 != local.r3:
        raise _incompatible(f"R3 format: remote {remote.r3}, local {local.r3}")
    if need_routes and (remote.r3 is None or local.r3 is None):
        side = "remote" if remote.r3 is None else "local"
        raise _incompatible(f"routes are needed but R3 is absent on the {side} side")


def verify_manifest(
    manifest: Manifest,
    expected_transfer_id: str,
    expected_epoch: int,
    expected_keys: Sequence[BlockKey],
    caps: Capabilities,
    *,
    start_block: int = 0,
    need_routes: bool = False,
) -> None:
    """Raise ``TransferError`` unless ``manifest`` may serve blocks ``start_block ..
    start_block + len(expected_keys)`` of the transfer the receiver asked for.

    ``expected_keys`` are the keys the receiver computed from its own provenance and tokens;
    ``caps`` are the receiver's capabilities. Checks, in order: format version, transfer id
    (``STALE_TRANSFER_ID``), epoch (``STALE_EPOCH``), provenance / layout / R3 format
    (``INCOMPATIBLE``), block count (``TRUNCATED``), per-block consistency (index, byte count,
    address count, route record length; ``BAD_MANIFEST`` / ``TRUNCATED``), keys (``KEY_MISMATCH``).
    """
    if manifest.format_version != FORMAT_VERSION:
        raise _incompatible(f"manifest format version {manifest.format_version}, local {FORMAT_VERSION}")
    if manifest.transfer_id != expected_transfer_id:
        raise TransferError(
            ErrorCode.STALE_TRANSFER_ID,
            f"manifest is for transfer {manifest.transfer_id!r}, expected {expected_transfer_id!r}",
        )
    if manifest.epoch != expected_epoch:
        raise TransferError(
            ErrorCode.STALE_EPOCH, f"manifest epoch {manifest.epoch}, expected {expected_epoch}"
        )
    if manifest.provenance_digest != caps.provenance_digest:
        raise _incompatible("manifest provenance digest differs from the local provenance")
    if manifest.kv_layout != caps.kv_layout:
        raise _incompatible(f"manifest KV layout {manifest.kv_layout}, local {caps.kv_layout}")
    if manifest.r3 is not None and manifest.r3 != caps.r3:
        raise _incompatible(f"manifest R3 format {manifest.r3}, local {caps.r3}")
    if need_routes and manifest.r3 is None:
        raise _incompatible("routes are needed but the manifest carries none")

    layout = manifest.kv_layout
    n = len(manifest.blocks)
    need = start_block + len(expected_keys)
    if n < need:
        raise TransferError(ErrorCode.TRUNCATED, f"manifest lists {n} blocks, need {need}")
    covered = -(-manifest.num_tokens // layout.block_size)
    if covered != n:
        code = ErrorCode.TRUNCATED if n < covered else ErrorCode.BAD_MANIFEST
        raise TransferError(code, f"{manifest.num_tokens} tokens need {covered} blocks, manifest lists {n}")
    if len(manifest.block_addrs) != n:
        raise TransferError(
            ErrorCode.BAD_MANIFEST, f"{len(manifest.block_addrs)} address lists for {n} blocks"
        )
    record = None if manifest.r3 is None else manifest.r3.record_nbytes(layout.block_size)
    for i, entry in enumerate(manifest.blocks):
        if entry.index != i:
            raise TransferError(ErrorCode.BAD_MANIFEST, f"block {i} has index {entry.index}")
        if entry.nbytes != layout.block_nbytes:
            raise TransferError(
                ErrorCode.BAD_MANIFEST, f"block {i}: {entry.nbytes} bytes, layout has {layout.block_nbytes}"
            )
        if len(manifest.block_addrs[i]) != 2 * layout.num_layers:
            raise TransferError(
                ErrorCode.BAD_MANIFEST,
                f"block {i}: {len(manifest.block_addrs[i])} region addresses, need {2 * layout.num_layers}",
            )
        got = None if entry.routes is None else len(entry.routes)
        if got != record:
            code = (
                ErrorCode.TRUNCATED
                if got is not None and record is not None and got < record
                else ErrorCode.BAD_MANIFEST
            )
            raise TransferError(code, f"block {i}: route record of {got} bytes, expected {record}")
    for j, key in enumerate(expected_keys):
        if manifest.blocks[start_block + j].key != key:
            raise TransferError(
                ErrorCode.KEY_MISMATCH,
                f"block {start_block + j}: source key {manifest.blocks[start_block + j].key.hex()[:16]}, "
                f"local key {key.hex()[:16]}",
            )
