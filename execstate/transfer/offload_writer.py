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

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from execstate.identity.checksum import checksum
from execstate.identity.keys import BlockKey
from execstate.identity.secret_ring import SecretRing
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.pool_units import UnitOrigin
from execstate.state.tiers.store import UnitStore
from execstate.state.tiers.unit import FORMAT_VERSION, UnitLayout, UnitRecord, pack_unit, sign

logger = logging.getLogger("execstate.offload")


@dataclass(frozen=True, slots=True)
class WriteJob:
    key: BlockKey
    origin: UnitOrigin
    slot: int
    routes: bytes | None


class _Stop:
    pass


class WriteBackWorker:
    def __init__(self, host: HostCache, stores: Sequence[UnitStore], layout: UnitLayout,
                 ring: SecretRing, on_drained: Callable[[], object] | None = None) -> None:
        self.host = host
        self.on_drained = on_drained
        self.stores = list(stores)
        self.layout = layout
        self.ring = ring
        self._jobs: queue.SimpleQueue[WriteJob | _Stop] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="execstate-offload-write", daemon=True)
        self._thread.start()

    def submit(self, job: WriteJob) -> None:
        with self._idle:
            self._pending += 1
        self._jobs.put(job)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every submitted job is done; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    @property
    def num_pending(self) -> int:
        return self._pending

    def close(self, timeout: float | None = 30.0) -> None:
        """Finish the queued jobs, then stop the thread."""
        self._jobs.put(_Stop())
        self._thread.join(timeout)

    # -- worker thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + 10)
        while True:
            job = self._jobs.get()
            if isinstance(job, _Stop):
                return
            try:
                self._write(job)
            except Exception:  # a bug in one write-back must not stop the others
                logger.exception("offload write-back of %s failed", job.key.hex()[:16])
            finally:
                self._done(job)

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

    def _done(self, job: WriteJob) -> None:
        try:
            self.host.unpin(job.key)
        finally:
            with self._idle:
                last = self._pending == 1
            if last and self.on_drained is not None:  # before the count drops: flush() waits for it
                try:
                    self.on_drained()
                except Exception:  # noqa: BLE001 - the events must never stop the write-backs
                    logger.exception("offload write-back: on_drained failed")
            with self._idle:
                self._pending -= 1
                if self._pending == 0:
                    self._idle.notify_all()
