"""The write-back thread: seals units evicted from the pool and writes them down the tiers.

Call order (docs/offload.md "Write-back"): on the engine thread, the pool evicts a cached block;
the offload connector reserves a DRAM slot (``HostCache.reserve``), copies the block's KV into it
(``KVPool.export_block``) and :meth:`WriteBackWorker.submit` s a :class:`WriteJob`. Then, on the
thread ``execstate-offload-write``, per job in submission order:

1. the KV checksum of the slot and the route checksum are computed and the record built
   and signed (``unit.sign``);
2. ``HostCache.seal``: the unit is visible in DRAM (when DRAM is a tier);
3. the blob is ``put`` into each lower tier (disk, Redis) that does not hold the key yet
   (write-through: every tier gets every unit; each drops its own oldest when full);
4. ``HostCache.unpin``: the slot may be reused (a staging-only slab frees it now);
5. when no job is left, ``on_drained`` (the engine's ``KVEvents.flush``: the tiers reported
   each unit they stored or dropped as it happened; a burst of write-backs is published as one
   batch, also while the engine is idle). It must not block.

A job never blocks the engine: the queue is bounded by the slab's slots (a reservation fails
when every slot is pinned: the write-back is dropped). A tier that fails is skipped (counted,
logged by the tier); the thread survives any exception in a job. The thread runs at a lower CPU
priority (nice +10): on a machine whose cores the forward pass keeps busy, a write-back waits for
a free moment instead of stretching the step (an OpenMP region waits for its slowest thread);
nothing waits for it but a later reload of that unit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from execstate.identity.checksum import checksum
from execstate.identity.keys import BlockKey
from execstate.identity.secret_ring import SecretRing
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.pool_units import UnitOrigin
from execstate.state.tiers.store import UnitStore
from execstate.state.tiers.unit import FORMAT_VERSION, UnitLayout, UnitRecord, pack_unit, sign
from execstate.transfer.job_thread import JobThread


@dataclass(frozen=True, slots=True)
class WriteJob:
    key: BlockKey
    origin: UnitOrigin
    slot: int
    routes: bytes | None


class WriteBackWorker:
    def __init__(self, host: HostCache, stores: Sequence[UnitStore], layout: UnitLayout,
                 ring: SecretRing, on_drained: Callable[[], object] | None = None) -> None:
        self.host = host
        self.stores = list(stores)
        self.layout = layout
        self.ring = ring
        self._thread: JobThread[WriteJob, None] = JobThread("execstate-offload-write", self._one,
                                                            on_drained=on_drained, niceness=10)

    def submit(self, job: WriteJob) -> None:
        self._thread.submit(job)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every submitted job is done; False on timeout."""
        return self._thread.flush(timeout)

    @property
    def num_pending(self) -> int:
        return self._thread.num_pending

    def close(self, timeout: float | None = 30.0) -> None:
        """Finish the queued jobs, then stop the thread."""
        self._thread.close(timeout)

    # -- worker thread -----------------------------------------------------------------------------

    def _one(self, job: WriteJob) -> None:
        try:
            self._write(job)
        finally:
            self.host.unpin(job.key)

    def _write(self, job: WriteJob) -> None:
        kv = self.host.view(job.slot)
        o = job.origin
        record = sign(UnitRecord(
            format_version=FORMAT_VERSION, key=job.key, parent=o.parent, root=o.root, token_ids=list(o.token_ids),
            layout=self.layout, kv_checksum=checksum(kv.data),
            routes_checksum=None if job.routes is None else checksum(job.routes),
            weights_version=o.weights_version, tenant=o.tenant,
        ), self.ring)
        self.host.seal(job.key, record, job.routes)
        parts = None
        for store in self.stores:
            if store.contains(job.key):
                continue
            if parts is None:
                parts = pack_unit(record, job.routes, kv.data)
            store.put(job.key, parts)
