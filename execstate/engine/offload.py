"""Offload tiers wired into one engine (docs/offload.md; docs/contracts.md 3).

:func:`build_offload` (called once by ``LLMEngine.__init__``, after the KV events and before the
block pool) builds, from the ``offload_*`` options, the DRAM tier (``HostCache``; a small staging
slab when DRAM is not a tier), the lower tiers (``DiskStore``, ``RedisStore``) and the write-back
and reload threads. The connector has two roles (vLLM v1's KV connector: a worker side and a
scheduler side), which the engine gives, at their construction, to the parts that call them:

- the pool's side: ``BlockPool(write_back=connector.write_back)``: a cached block the pool evicts
  is copied into a DRAM slot (engine thread, before its slot is reused) and handed to the
  write-back thread with its origin and route record (``transfer/offload_writer.py``);
  ``KVCacheManager(pool_units=connector.units)``: where ``commit`` notes what each cached block
  was computed from (``state/tiers/pool_units.py``), which the write-back needs for the record;
- the scheduler's side: :meth:`OffloadConnector.scheduler_role` (once, given the KV cache
  manager) builds :class:`~execstate.engine.offload_loads.OffloadLoads`, the source that reloads a
  prompt's blocks from the tiers (``transfer/offload_loader.py``), which the engine passes to
  ``Scheduler(offload=...)``.

A hibernating session (``session/lm/hibernation.py``) writes its blocks now, while it still holds
them (:meth:`OffloadConnector.store_units`, the same path as an eviction's write-back), and keeps
its manifest in :attr:`OffloadConnector.manifests` (the Redis server of the shared tier, when one
is configured: ``state/tiers/manifest_store.py``); a session woken here from another replica's
manifest makes its units known to the Redis tier's index (:meth:`OffloadConnector.adopt_shared`).

KV events: when the engine publishes them (``state/kv_events/recorder.py``, attached first), the DRAM,
disk and Redis tiers are built with the engine's ``KVEvents`` as their ``UnitEvents``: each
reports every unit it starts or stops holding (medium ``dram``, ``disk``, ``shared``), named by
its record (parent, tokens, weights version); the write-back thread flushes them when its queue
empties, and :meth:`OffloadConnector.adopt_shared` after an adoption.

A unit is written back only with everything that makes it one: its origin (blocks committed by
``commit``) and, when the engine returns routes, its route record (fail closed: a unit without
its routes is never written). Requests that force routes are neither written nor served.

Threads: the engine thread calls :meth:`OffloadConnector.write_back` and the loads; the tiers are
shared with the two worker threads under their own locks. :meth:`close` finishes the queued
write-backs, stops the threads and closes the stores; it runs by itself when the engine is
garbage-collected or the interpreter exits (nothing here holds the engine: the reload thread
wakes it through a weak reference).
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from execstate.engine.offload_config import offload_enabled
from execstate.engine.offload_loads import OffloadLoads
from execstate.identity.keys import BlockKey
from execstate.identity.secret_ring import SECRET_ENV, SecretRing
from execstate.state.block_pool import BlockId
from execstate.state.tiers.disk_store import DiskStore
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.pool_units import BlockUnit, PoolUnits
from execstate.state.tiers.stats import TierSnapshot
from execstate.state.tiers.store import UnitStore
from execstate.state.tiers.unit import UnitLayout
from execstate.state.tiers.unit_events import UnitEvents
from execstate.transfer.offload_loader import ReloadWorker
from execstate.transfer.offload_writer import WriteBackWorker, WriteJob

if TYPE_CHECKING:
    from execstate.engine.config import EngineConfig
    from execstate.engine.kv_cache_manager import KVCacheManager
    from execstate.model.config import ModelConfig
    from execstate.state.kv_pool import KVPool
    from execstate.state.route_store import RouteStore
    from execstate.state.tiers.manifest_store import ManifestStore


class OffloadHost(Protocol):
    """What the connector needs of the engine that owns it (``LLMEngine`` is one), all built before
    it: its config, KV pool, route store, model config, KV events and ``wake`` (called from the
    reload thread when a load finished)."""

    config: EngineConfig
    kv_pool: KVPool
    route_store: RouteStore | None
    model_config: ModelConfig
    return_routes: bool

    @property
    def kv_events(self) -> TierEvents | None: ...  # read-only here: LLMEngine's is a KVEvents

    def wake(self) -> None: ...


class TierEvents(UnitEvents, Protocol):
    """Where the tiers report their units (``state/kv_events/recorder.py``'s ``KVEvents``), and ``flush``:
    publish what was reported (any thread; never blocks)."""

    def flush(self) -> int: ...

logger = logging.getLogger("execstate.offload")
STAGING_SLOTS = 64  # write-backs in flight to the lower tiers when DRAM is not a tier


def build_offload(engine: OffloadHost) -> OffloadConnector | None:
    """The engine's offload connector, or None when no tier is configured."""
    return OffloadConnector(engine) if offload_enabled(engine.config) else None


class OffloadConnector:
    def __init__(self, engine: OffloadHost) -> None:
        cfg = engine.config
        pool = engine.kv_pool
        mc = engine.model_config
        self.kv_pool = pool
        self.route_store = engine.route_store
        routes = engine.return_routes
        _, _, heads, head_dim = pool.k.shape
        self.layout = UnitLayout(
            num_layers=pool.num_layers, block_size=pool.block_size, num_kv_heads=int(heads), head_dim=int(head_dim),
            dtype=str(pool.k.dtype).removeprefix("torch."),
            route_layers=mc.num_moe_layers if routes else None, route_top_k=mc.top_k if routes else None,
        )
        # Every unit is signed: by the instances' shared ring when one is configured, else by a key
        # this process alone knows (a local tier's units are then readable by this process only).
        # A shared tier without the shared ring would trust whoever can write to it: refused.
        self.shared_ring = SecretRing.resolve(cfg.offload_secret)
        if self.shared_ring is None and cfg.offload_redis_url is not None:
            raise ValueError("offload_redis_url needs the instances' shared secret (offload_secret, or $"
                             f"{SECRET_ENV}): a shared tier's units must prove who wrote them")
        ring = self.ring = self.shared_ring or SecretRing.ephemeral()
        unit = pool.unit_nbytes()
        dram_slots = cfg.offload_dram_bytes // unit
        events = self.events = engine.kv_events
        self.host = HostCache(dram_slots or STAGING_SLOTS, unit, cfg.offload_policy, visible=dram_slots > 0,
                              events=events)
        self.instance_id = f"execstate-{uuid.uuid4().hex[:12]}"  # names this engine's manifests
        self.stores: list[UnitStore] = []
        self.redis: UnitStore | None = None
        self.manifests: ManifestStore | None = None
        if cfg.offload_disk_dir is not None:
            self.stores.append(DiskStore(Path(cfg.offload_disk_dir), cfg.offload_disk_bytes, cfg.offload_policy,
                                         events=events))
        if cfg.offload_redis_url is not None:
            from execstate.state.tiers.manifest_store import ManifestStore  # the client loads only when used
            from execstate.state.tiers.redis_store import RedisStore

            self.redis = RedisStore(cfg.offload_redis_url, cfg.offload_redis_bytes, cfg.offload_policy,
                                    timeout_s=cfg.offload_timeout_s, events=events)
            self.stores.append(self.redis)
            self.manifests = ManifestStore(cfg.offload_redis_url, cfg.offload_timeout_s)
        self.units = PoolUnits()
        self.writer = WriteBackWorker(self.host, self.stores, self.layout, ring,
                                      on_drained=None if events is None else events.flush)
        wake = weakref.WeakMethod(engine.wake)
        self.loader = ReloadWorker(pool, self.host, self.stores, self.layout, mc.num_experts if routes else None,
                                   ring, on_result=lambda: _call(wake))
        self.return_routes = routes
        self.timeout_s = cfg.offload_timeout_s
        self._loads: OffloadLoads | None = None  # the scheduler's side (scheduler_role)
        closing: list[UnitStore | ManifestStore] = [*self.stores, *([self.manifests] if self.manifests else [])]
        self._closer = weakref.finalize(engine, _close, self.writer, self.loader, closing)
        if events is not None:
            events.flush()  # the units the disk tier found at start

    def scheduler_role(self, kv: KVCacheManager) -> OffloadLoads:
        """The scheduler's side (module docstring), built once the KV cache manager exists (it
        keys a prompt's blocks): the source ``Scheduler(offload=...)`` consults at admission."""
        if self._loads is not None:
            raise RuntimeError("the offload connector's scheduler side is built once")
        self._loads = OffloadLoads(kv, self.tiers, self.loader, self.return_routes, self.timeout_s)
        return self._loads

    @property
    def loads(self) -> OffloadLoads:
        """The scheduler's side (:meth:`scheduler_role`; the engine builds it at construction)."""
        if self._loads is None:
            raise RuntimeError("the offload connector's scheduler side is not built (scheduler_role)")
        return self._loads

    def tiers(self) -> list[HostCache | UnitStore]:
        """The tiers a lookup consults, in order (DRAM only when it is a tier)."""
        return ([self.host] if self.host.visible else []) + self.stores

    def write_back(self, block_id: BlockId, key: BlockKey) -> None:
        """``BlockPool`` write-back hook (engine thread): copy the evicted unit out and queue it.
        Never raises: a unit that cannot be written back is recomputed when needed."""
        try:
            origin = self.units.pop(key)
            if origin is None:
                return
            routes = None
            if self.route_store is not None:
                record = self.route_store.get(key)
                if record is None:
                    return
                routes = record.tobytes()
            if self.host.visible and self.host.contains(key):
                return
            slot = self.host.reserve(key)
            if slot is None:
                return
            self.kv_pool.export_block(int(block_id), self.host.view(slot))
            self.writer.submit(WriteJob(key, origin, slot, routes))
        except Exception:  # noqa: BLE001 - an eviction must never fail because of a tier
            logger.exception("offload write-back of block %d failed", block_id)

    @property
    def unit_nbytes(self) -> int:
        """The KV bytes of one unit (one block in every layer)."""
        return self.kv_pool.unit_nbytes()

    def store_units(self, units: Sequence[BlockUnit]) -> int:
        """Write pool blocks as units now (engine thread; a hibernating session's, which it still
        holds), each unless a tier has it already; how many are in a tier or on their way. Without
        a DRAM tier the staging slots may all be in flight: it waits for them to drain (bounded
        by ``offload_timeout_s``) rather than drop the session's units. A unit
        without route rows when the engine returns routes is not written (fail closed). Never
        raises: what is not written is recomputed when needed."""
        stored = 0
        for u in units:
            try:
                if self.route_store is not None and u.routes is None:
                    continue
                if (self.host.visible and self.host.contains(u.key)) or (
                        not self.host.visible and self.stores and all(st.contains(u.key) for st in self.stores)):
                    stored += 1
                    continue
                slot = self.host.reserve(u.key)
                if slot is None and not self.host.visible and self.writer.num_pending:
                    self.writer.flush(self.timeout_s)  # the staging slots are all in flight: let them drain
                    slot = self.host.reserve(u.key)
                if slot is None:
                    stored += self.host.contains(u.key)
                    continue
                self.kv_pool.export_block(int(u.block_id), self.host.view(slot))
                self.writer.submit(WriteJob(u.key, u.origin, slot, u.routes))
                stored += 1
            except Exception:  # noqa: BLE001 - a hibernation must never fail because of a tier
                logger.exception("offload write of block %d failed", u.block_id)
        return stored

    def adopt_shared(self, keys: Sequence[BlockKey]) -> int:
        """Units among ``keys`` the Redis tier holds, now in its index (0 without one)."""
        from execstate.state.tiers.redis_store import RedisStore

        found = self.redis.adopt(keys) if isinstance(self.redis, RedisStore) else 0
        if found and self.events is not None:
            self.events.flush()
        return found

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every write-back submitted so far is in its tiers (tests, benchmarks)."""
        return self.writer.flush(timeout)

    def snapshot(self) -> list[TierSnapshot]:
        """Every tier's counters (``/metrics``; any thread)."""
        return [t.stats.snapshot() for t in self.tiers()]

    def check_integrity(self) -> None:
        self.host.check_integrity()

    def close(self) -> None:
        """Finish queued write-backs, stop the threads, close the stores (once; idempotent)."""
        self._closer()


def _call(ref: weakref.WeakMethod[Callable[[], None]]) -> None:
    fn = ref()
    if fn is not None:
        fn()


def _close(writer: WriteBackWorker, loader: ReloadWorker, stores: list[UnitStore | ManifestStore]) -> None:
    writer.close()
    loader.close()
    for store in stores:
        store.close()
