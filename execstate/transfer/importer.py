"""Receiver side of a transfer (decode instance, or any instance taking state in; docs/contracts.md 5).

:meth:`KVImporter.load` runs the whole protocol for one transfer, on the thread that owns the
importer (the decode instance's transfer thread, see ``transfer/load_worker.py``), into blocks the
caller already allocated and does not touch until the load returns: handshake (cached per source address, redone after a
failure or when the cached one no longer matches) -> ``GetManifest`` -> :func:`verify_manifest` -> NIXL read ->
per-block checksum of the received bytes -> ``Release`` (sent once a manifest for this transfer id arrived, verified or
not; after a timeout the source's TTL frees the pins). Transfer faults never raise: they return
``ok=False`` with the reason; only programming errors (bad arguments) raise.

Commit contract for the caller: blocks ``dst_block_ids[:num_blocks_verified]`` hold verified KV
(identity, epoch and checksum all matched) and may be committed to the cache under their keys;
every later block is garbage and must be recomputed (policy ``recompute``) or the request failed
(policy ``fail``). ``routes`` covers exactly the verified tokens and came with that KV.

:meth:`KVImporter.release` sends only the ``Release`` (the receiver had every block already). Test
doubles (``benchmarks/execstate_bench/faults.py``) override :meth:`KVImporter._fetch_manifest` and
:meth:`KVImporter._received`; the product importer injects nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from execstate.identity.keys import BlockKey, check_key
from execstate.state.block_pool import BlockId
from execstate.state.kv_pool import KVPool
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.checks import block_checksums, check_compatible, kv_layout_of, verify_manifest
from execstate.transfer.control import ControlClient
from execstate.transfer.errors import ErrorCode, TransferError
from execstate.transfer.manifest import Capabilities, Manifest, unpack_routes

# Failures after which the cached connection and handshake to a source are dropped.
_RECONNECT = {ErrorCode.TIMEOUT, ErrorCode.PROTOCOL, ErrorCode.SOURCE_CHANGED, ErrorCode.INCOMPATIBLE}


class LoadResult(NamedTuple):
    """Outcome of :meth:`KVImporter.load` (see the module docstring for the commit contract).

    ``num_tokens``: valid tokens held by the verified blocks (the last verified block may be the
    source's partial tail). ``routes``: ``int16 [num_tokens, n_moe_layers, top_k]`` from the
    manifest, ``None`` when the manifest carried no routes or nothing was verified.
    ``kv_bytes``: bulk bytes read; ``control_bytes``: control bytes sent + received by this load.
    ``error``: ``"<code>: <detail>"`` when ``ok`` is False, else ``None``; ``error_code`` its code.
    """

    ok: bool
    num_blocks_verified: int
    routes: np.ndarray | None
    kv_bytes: int
    control_bytes: int
    error: str | None
    elapsed_s: float
    num_tokens: int = 0
    error_code: ErrorCode | None = None


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """One load's arguments, as the hooks see them."""

    addr: str
    transfer_id: str  # the transfer the caller asked for
    epoch: int
    keys: Sequence[BlockKey]
    dst: Sequence[BlockId]
    need_routes: bool
    start: int


class KVImporter:
    """Loads exported blocks from remote :class:`KVExporter` s into one KV pool; one thread only.

    ``timeout_s`` bounds each control request (a dead source fails within it); the bulk read is
    bounded by ``bulk.timeout_s``. ``hash_executor`` (optional) verifies received blocks in parallel.
    """

    def __init__(
        self,
        pool: KVPool,
        caps: Capabilities,
        bulk: NixlBulk,
        timeout_s: float,
        hash_executor: Executor | None = None,
    ) -> None:
        if caps.kv_layout != kv_layout_of(pool):
            raise ValueError(f"caps layout {caps.kv_layout} is not the pool's {kv_layout_of(pool)}")
        self.pool, self.caps, self.bulk, self.timeout_s = pool, caps, bulk, timeout_s
        self._hash_executor = hash_executor
        self._clients: dict[str, ControlClient] = {}
        self._remote_caps: dict[str, Capabilities] = {}

    def load(
        self,
        remote_addr: str,
        transfer_id: str,
        epoch: int,
        expected_keys: Sequence[BlockKey],
        dst_block_ids: Sequence[BlockId],
        need_routes: bool,
        start_block: int = 0,
    ) -> LoadResult:
        """Load blocks ``start_block .. start_block + len(expected_keys)`` of ``transfer_id`` from
        the exporter at ``remote_addr`` into ``dst_block_ids`` (same length, distinct, allocated
        by the caller and not shared). ``epoch`` is the source epoch of the handoff parameters.
        """
        n = len(expected_keys)
        if n == 0 or len(dst_block_ids) != n or len(set(dst_block_ids)) != n:
            raise ValueError(f"need >= 1 key and {n} distinct destination blocks, got {len(dst_block_ids)}")
        for key in expected_keys:
            check_key(key)
        if any(not 0 <= b < self.pool.num_blocks for b in dst_block_ids) or start_block < 0:
            raise ValueError("destination block id out of range or negative start_block")
        req = LoadRequest(remote_addr, transfer_id, epoch, expected_keys, dst_block_ids, need_routes, start_block)
        return self._load(req)

    def release(self, remote_addr: str, transfer_id: str) -> bool:
        """Tell the source at ``remote_addr`` to drop ``transfer_id``'s pins without loading it
        (the receiver's own cache held every block). True if the source acknowledged; a failure is
        harmless (the source's TTL frees the pins)."""
        client = self._client(remote_addr)
        try:
            client.release(transfer_id)
        except TransferError as e:
            if e.code in _RECONNECT:
                self._forget(remote_addr)
            return False
        return True

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._remote_caps.clear()

    # -- hooks (test doubles override these) ------------------------------------------------------

    def _fetch_manifest(self, client: ControlClient, req: LoadRequest) -> Manifest:
        return client.get_manifest(req.transfer_id, req.epoch)

    def _received(self, req: LoadRequest) -> None:
        """Called after the bulk read landed in ``req.dst``, before the checksums."""

    # -- internals -------------------------------------------------------------------------------

    def _load(self, req: LoadRequest) -> LoadResult:
        t0 = time.monotonic()
        client = self._client(req.addr)
        c0 = client.bytes_sent + client.bytes_received
        manifest: Manifest | None = None
        kv_bytes = 0
        verified = 0
        error: TransferError | None = None
        try:
            remote = self._handshake(req.addr, client, req.need_routes)
            manifest = self._fetch_manifest(client, req)
            if manifest.source_instance_id != remote.instance_id:
                raise TransferError(
                    ErrorCode.SOURCE_CHANGED,
                    f"manifest from instance {manifest.source_instance_id!r}, handshake with {remote.instance_id!r}",
                )
            verify_manifest(
                manifest,
                req.transfer_id,
                req.epoch,
                req.keys,
                self.caps,
                start_block=req.start,
                need_routes=req.need_routes,
            )
            rng = range(req.start, req.start + len(req.keys))
            self.bulk.read(
                manifest.agent_name, manifest.agent_metadata, [manifest.block_addrs[i] for i in rng], req.dst
            )
            kv_bytes = len(req.keys) * manifest.kv_layout.block_nbytes
            self._received(req)
            for j, got in enumerate(
                block_checksums(self.pool, [int(b) for b in req.dst], self._hash_executor)
            ):
                if got != manifest.blocks[req.start + j].checksum:
                    raise TransferError(
                        ErrorCode.CHECKSUM_MISMATCH,
                        f"block {req.start + j} (local {int(req.dst[j])}): received bytes differ from the "
                        "source's checksum",
                    )
                verified += 1
        except TransferError as e:
            error = e
            if e.code in _RECONNECT:
                self._forget(req.addr)
        if manifest is not None and manifest.transfer_id == req.transfer_id:
            self._release(client, req.transfer_id)  # never release a transfer that is not ours
        control = client.bytes_sent + client.bytes_received - c0
        tokens, routes = self._verified_tokens_and_routes(manifest, req.start, verified)
        return LoadResult(
            ok=error is None,
            num_blocks_verified=verified,
            routes=routes,
            kv_bytes=kv_bytes,
            control_bytes=control,
            error=None if error is None else str(error),
            elapsed_s=time.monotonic() - t0,
            num_tokens=tokens,
            error_code=None if error is None else error.code,
        )

    def _client(self, addr: str) -> ControlClient:
        client = self._clients.get(addr)
        if client is None:
            client = self._clients[addr] = ControlClient(addr, self.timeout_s)
        return client

    def _handshake(self, addr: str, client: ControlClient, need_routes: bool) -> Capabilities:
        """The source's capabilities, checked against ours. A cached handshake that no longer
        matches is asked again before it is refused: either side may have switched weights since
        (a fleet's rolling update switches both), and only the source's current answer counts."""
        remote = self._remote_caps.get(addr)
        if remote is not None:
            try:
                check_compatible(self.caps, remote, need_routes)
                return remote
            except TransferError as e:
                if e.code is not ErrorCode.INCOMPATIBLE:
                    raise
        remote = client.hello(self.caps)
        self._remote_caps[addr] = remote
        check_compatible(self.caps, remote, need_routes)
        return remote

    def _forget(self, addr: str) -> None:
        self._remote_caps.pop(addr, None)
        client = self._clients.get(addr)
        if client is not None:
            client.close()  # the next request opens a fresh socket; counters are kept

    def _release(self, client: ControlClient, transfer_id: str) -> None:
        # On failure the source's TTL frees the pins; nothing on this side depends on it.
        with contextlib.suppress(TransferError):
            client.release(transfer_id)

    def _verified_tokens_and_routes(
        self, manifest: Manifest | None, start: int, verified: int
    ) -> tuple[int, np.ndarray | None]:
        if manifest is None or verified == 0:
            return 0, None
        bs = manifest.kv_layout.block_size
        tokens = min((start + verified) * bs, manifest.num_tokens) - start * bs
        r3 = manifest.r3
        if r3 is None:
            return tokens, None
        records = [manifest.blocks[i].routes or b"" for i in range(start, start + verified)]
        return tokens, unpack_routes(records, r3, bs)[:tokens]
