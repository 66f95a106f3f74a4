"""Source side of a transfer (prefill instance, or any instance giving state away; docs/contracts.md 5).

:meth:`KVExporter.export` pins a finished request's blocks and snapshots their control state into
an immutable :class:`Manifest`; the receiver fetches it over the control channel and pulls the KV
bytes over the bulk channel, then sends ``Release``. The exporter is the :class:`ControlHandler`
of the source's :class:`ControlServer`.

Thread model:

- engine thread: ``export``, ``poll``, ``invalidate_all``, ``check_integrity`` -- the only
  callers of the block pool (pins taken in ``export``, dropped in ``poll``/``invalidate_all``).
- control thread: ``on_hello``, ``on_get_manifest``, ``on_release`` -- read immutable snapshots
  and move ids between the shared tables under ``_lock``; they never touch the block pool or
  the KV tensors. A ``Release`` is queued; the pin is dropped by the next ``poll``.

Lifetimes: every exported id ends exactly once as released, expired (TTL from export) or
invalidated (``invalidate_all`` bumps the epoch, e.g. on a weights update); its pins are dropped
exactly once. A pinned block is never rewritten by the engine, and the receiver verifies every
block's checksum, so a block freed while a slow receiver still reads it fails closed there.

Limits: at most ``max_inflight`` pinned transfers and ``max_bytes`` snapshot bytes (KV bytes of
the pinned blocks + route bytes; a block shared by two transfers counts twice). Over a limit,
``export`` raises :class:`TransferLimitError` and pins nothing; pinned transfers are unaffected.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from enum import Enum
from typing import NamedTuple

import numpy as np

from execstate.identity.keys import BlockKey, check_key
from execstate.state.block_pool import BlockId, BlockPool
from execstate.state.kv_pool import KVPool
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.checks import block_checksums, kv_layout_of
from execstate.transfer.control import Ack, ErrorReply, GetManifest, Hello, HelloReply, Release
from execstate.transfer.errors import ErrorCode, TransferError, TransferLimitError
from execstate.transfer.manifest import FORMAT_VERSION, BlockEntry, Capabilities, Manifest, pack_routes


class ReleaseReason(Enum):
    RELEASED = "released"
    EXPIRED = "expired"
    INVALIDATED = "invalidated"


_CODE = {
    ReleaseReason.RELEASED: ErrorCode.RELEASED,
    ReleaseReason.EXPIRED: ErrorCode.EXPIRED,
    ReleaseReason.INVALIDATED: ErrorCode.INVALIDATED,
}


class Released(NamedTuple):
    """One transfer whose pins were dropped by ``poll`` / ``invalidate_all``."""

    transfer_id: str
    reason: ReleaseReason
    num_blocks: int


@dataclass(slots=True)
class ExporterStats:
    exported: int = 0
    exported_bytes: int = 0  # KV bytes snapshotted
    rejected: int = 0  # TransferLimitError
    released: int = 0
    expired: int = 0
    invalidated: int = 0
    manifests_served: int = 0


@dataclass(frozen=True, slots=True)
class _Snapshot:
    manifest: Manifest
    block_ids: tuple[BlockId, ...]
    nbytes: int
    deadline: float


class KVExporter:
    """Pins, snapshots and serves exported blocks of one KV pool (see the module docstring).

    ``clock`` is the TTL clock (``poll(now)`` takes the same clock's time); ``remember_finished``
    bounds the ids kept to answer "released / expired / invalidated" instead of "unknown";
    ``hash_executor`` (optional) hashes an export's blocks in parallel.
    """

    def __init__(
        self,
        pool: KVPool,
        block_pool: BlockPool,
        caps: Capabilities,
        bulk: NixlBulk,
        max_inflight: int,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        remember_finished: int = 4096,
        hash_executor: Executor | None = None,
    ) -> None:
        if caps.kv_layout != kv_layout_of(pool):
            raise ValueError(f"caps layout {caps.kv_layout} is not the pool's {kv_layout_of(pool)}")
        if max_inflight < 1 or max_bytes < 1 or ttl_s <= 0:
            raise ValueError("max_inflight, max_bytes and ttl_s must be positive")
        self.pool, self.block_pool, self.caps, self.bulk = pool, block_pool, caps, bulk
        self.max_inflight, self.max_bytes, self.ttl_s = max_inflight, max_bytes, ttl_s
        self._clock = clock
        self._remember = remember_finished
        self._hash_executor = hash_executor
        # engine thread only
        self._pinned: dict[str, _Snapshot] = {}
        self._pinned_bytes = 0
        # shared with the control thread, under _lock
        self._lock = threading.Lock()
        self._epoch = 0
        self._servable: dict[str, _Snapshot] = {}
        self._finished: OrderedDict[str, ReleaseReason] = OrderedDict()
        self._queue: list[tuple[str, ReleaseReason]] = []
        self._stats = ExporterStats()

    # -- engine thread ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        with self._lock:
            return self._epoch

    @property
    def num_inflight(self) -> int:
        return len(self._pinned)

    @property
    def inflight_bytes(self) -> int:
        return self._pinned_bytes

    @property
    def stats(self) -> ExporterStats:
        with self._lock:
            return replace(self._stats)

    def export(
        self,
        transfer_id: str,
        epoch: int,
        block_ids: Sequence[BlockId],
        keys: Sequence[BlockKey],
        routes: np.ndarray | None,
        num_tokens: int,
    ) -> None:
        """Pin ``block_ids`` (one reference each) and make them servable as ``transfer_id``.

        ``keys[i]`` is block ``i``'s key; ``num_tokens`` valid tokens fill the blocks (only the
        last may be partial); ``routes`` (``int16 [R, n_moe_layers, top_k]`` with
        ``num_tokens <= R <= len(block_ids) * block_size``, rows past ``R`` padded with zeros) or
        ``None`` when the request did not capture routes. Engine thread; call before the request
        frees its own references. Raises ``TransferError(STALE_EPOCH)`` if ``epoch`` is not the
        current epoch and :class:`TransferLimitError` over a limit (nothing pinned either way);
        ``ValueError`` for bad arguments or a reused ``transfer_id``.
        """
        n = len(block_ids)
        layout = self.caps.kv_layout
        bs = layout.block_size
        if not isinstance(transfer_id, str) or not 0 < len(transfer_id) <= 256:
            raise ValueError(f"transfer_id must be a non-empty str of <= 256 chars, got {transfer_id!r}")
        if n == 0 or len(keys) != n:
            raise ValueError(f"need >= 1 block and one key per block, got {n} blocks, {len(keys)} keys")
        for key in keys:
            check_key(key)
        if -(-num_tokens // bs) != n:
            raise ValueError(f"{num_tokens} tokens do not fill exactly {n} blocks of {bs}")
        with self._lock:
            if transfer_id in self._servable or transfer_id in self._finished or transfer_id in self._pinned:
                raise ValueError(f"transfer id {transfer_id!r} was already exported")
            current = self._epoch
        records: list[bytes | None] = [None] * n
        if routes is not None:
            if self.caps.r3 is None:
                raise ValueError("routes given but this instance's capabilities have no R3 format")
            records = list(pack_routes(routes, self.caps.r3, bs, n, num_tokens))
        if epoch != current:
            raise TransferError(ErrorCode.STALE_EPOCH, f"export at epoch {epoch}, exporter is at {current}")
        nbytes = n * layout.block_nbytes + sum(len(r) for r in records if r is not None)
        if len(self._pinned) + 1 > self.max_inflight or self._pinned_bytes + nbytes > self.max_bytes:
            with self._lock:
                self._stats.rejected += 1
            raise TransferLimitError(
                f"{len(self._pinned)} transfers / {self._pinned_bytes} bytes in flight; "
                f"limits {self.max_inflight} / {self.max_bytes}, this one needs {nbytes} bytes"
            )
        self.block_pool.acquire(block_ids)  # validates every id before pinning any
        try:
            checksums = block_checksums(self.pool, [int(b) for b in block_ids], self._hash_executor)
        except BaseException:
            self.block_pool.free(block_ids)
            raise
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            source_instance_id=self.caps.instance_id,
            transfer_id=transfer_id,
            epoch=epoch,
            provenance_digest=self.caps.provenance_digest,
            kv_layout=layout,
            r3=None if routes is None else self.caps.r3,
            num_tokens=num_tokens,
            blocks=[
                BlockEntry(i, bytes(keys[i]), layout.block_nbytes, checksums[i], records[i]) for i in range(n)
            ],
            agent_name=self.bulk.name,
            agent_metadata=self.bulk.metadata(),
            block_addrs=self.bulk.block_addrs(block_ids),
        )
        snap = _Snapshot(manifest, tuple(block_ids), nbytes, self._clock() + self.ttl_s)
        self._pinned[transfer_id] = snap
        self._pinned_bytes += nbytes
        with self._lock:
            self._servable[transfer_id] = snap
            self._stats.exported += 1
            self._stats.exported_bytes += n * layout.block_nbytes

    def poll(self, now: float | None = None) -> list[Released]:
        """Drop the pins of released transfers and of those whose TTL passed by ``now``.

        Engine thread, once per step. Returns what was released, in order.
        """
        now = self._clock() if now is None else now
        with self._lock:
            for tid in [t for t, s in self._servable.items() if s.deadline <= now]:
                self._finish(tid, ReleaseReason.EXPIRED)
        return self._drain()

    def invalidate_all(self) -> list[Released]:
        """Bump the epoch and drop every pinned transfer (e.g. on a weights update).

        Older transfers become unservable (``GetManifest`` answers ``invalidated``); exports
        must then pass the new :attr:`epoch`. Engine thread. Returns what was released.
        """
        with self._lock:
            self._epoch += 1
            for tid in list(self._servable):
                self._finish(tid, ReleaseReason.INVALIDATED)
        return self._drain()

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant. Engine thread."""
        with self._lock:
            servable = set(self._servable)
            queued = [tid for tid, _ in self._queue]
            finished = set(self._finished)
        if (
            servable | set(queued) != set(self._pinned)
            or len(queued) != len(set(queued))
            or servable & set(queued)
        ):
            raise AssertionError("pinned transfers == servable + queued for release, disjoint")
        if servable & finished:
            raise AssertionError(f"servable transfers are not finished: {sorted(servable & finished)[:4]}")
        if self._pinned_bytes != sum(s.nbytes for s in self._pinned.values()):
            raise AssertionError("pinned bytes add up")
        if len(self._pinned) > self.max_inflight or self._pinned_bytes > self.max_bytes:
            raise AssertionError("within limits")
        pins = Counter(b for s in self._pinned.values() for b in s.block_ids)
        for b, count in pins.items():
            if self.block_pool.ref_count(b) < count:
                raise AssertionError(
                    f"block {b} pinned {count}x with ref_count {self.block_pool.ref_count(b)}"
                )

    # -- control thread (ControlHandler) ---------------------------------------------------------

    def on_hello(self, msg: Hello) -> HelloReply:
        return HelloReply(self.caps)

    def on_get_manifest(self, msg: GetManifest) -> Manifest | ErrorReply:
        with self._lock:
            snap = self._servable.get(msg.transfer_id)
            if snap is None:
                reason = self._finished.get(msg.transfer_id)
                if reason is None:
                    return ErrorReply(ErrorCode.UNKNOWN_TRANSFER, f"transfer {msg.transfer_id!r} is unknown")
                return ErrorReply(_CODE[reason], f"transfer {msg.transfer_id!r} was {reason.value}")
            if msg.epoch != snap.manifest.epoch:
                return ErrorReply(
                    ErrorCode.STALE_EPOCH,
                    f"transfer {msg.transfer_id!r} is at epoch {snap.manifest.epoch}, request says {msg.epoch}",
                )
            if self._clock() >= snap.deadline:
                return ErrorReply(ErrorCode.EXPIRED, f"transfer {msg.transfer_id!r} passed its TTL")
            self._stats.manifests_served += 1
            return snap.manifest

    def on_release(self, msg: Release) -> Ack | ErrorReply:
        with self._lock:
            if msg.transfer_id in self._servable:
                self._finish(msg.transfer_id, ReleaseReason.RELEASED)
            elif msg.transfer_id not in self._finished:
                return ErrorReply(ErrorCode.UNKNOWN_TRANSFER, f"transfer {msg.transfer_id!r} is unknown")
            return Ack()

    # -- internals -------------------------------------------------------------------------------

    def _finish(self, tid: str, reason: ReleaseReason) -> None:
        """Under ``_lock``: servable -> finished, queued for unpinning."""
        del self._servable[tid]
        self._finished[tid] = reason
        while len(self._finished) > self._remember:
            self._finished.popitem(last=False)
        self._queue.append((tid, reason))

    def _drain(self) -> list[Released]:
        """Engine thread: unpin everything queued."""
        with self._lock:
            queue, self._queue = self._queue, []
        out: list[Released] = []
        for tid, reason in queue:
            snap = self._pinned.pop(tid)
            self._pinned_bytes -= snap.nbytes
            self.block_pool.free(reversed(snap.block_ids))
            out.append(Released(tid, reason, len(snap.block_ids)))
        with self._lock:
            for r in out:
                field = r.reason.value  # "released" | "expired" | "invalidated"
                setattr(self._stats, field, getattr(self._stats, field) + 1)
        return out
