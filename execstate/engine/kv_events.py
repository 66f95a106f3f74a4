"""KV cache events of one engine: recorded where the cache changes, published once per step.

:func:`attach_kv_events` (called once by ``LLMEngine.__init__``) returns None unless
``EngineConfig.kv_events`` publishes; else a :class:`KVEvents` installed in two places, the only
two where the pool's prefix-cache map changes:

- ``KVCacheManager.events``: ``commit`` reports each run of blocks it registered
  (``BlockPool.commit`` returned True) as one ``BlockStored`` (keys, parent key: the provenance
  root for a prompt's first block, token ids, the weights version);
- ``BlockPool.set_evict_observer``: ``allocate`` reports the cached blocks it evicted as one
  ``BlockRemoved``.

So the set of keys a subscriber holds for medium ``pool`` equals the pool's cache map after each
step (the fleet tests rebuild it and compare). Events are collected on the engine thread and
handed to the publisher (``transfer/kv_events_publisher.py``) as one batch at the end of each
``LLMEngine.step`` (:meth:`KVEvents.flush`), nothing when nothing changed.

The tiers below the pool (``dram``, ``disk``, ``shared``: ``engine/offload.py`` builds them with
this object as their ``UnitEvents``, ``state/tiers/unit_events.py``) report every unit they
start or stop holding through :meth:`KVEvents.unit_stored` / :meth:`KVEvents.units_removed`,
from whatever thread changed them (engine, write-back, reload), under their own lock: so the
events of one medium are recorded in the order of its changes. A stored event names the unit's
parent key, tokens and weights version from its record. Besides the end of each step, the
write-back thread flushes when its queue empties (write-backs finish after the step that
evicted the blocks, possibly while the engine is idle). :meth:`flush` publishes under the lock,
so batches leave in the order their events were recorded, whichever thread flushes.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from execstate.identity.keys import BlockKey
from execstate.state.kv_events import POOL, BlockRemoved, BlockStored, KVCacheEvent, KVEventBatch
from execstate.state.tiers.unit import UnitRecord
from execstate.transfer.kv_events_publisher import ZmqEventPublisher

if TYPE_CHECKING:
    from execstate.engine.config import EngineConfig
    from execstate.engine.kv_cache_manager import KVCacheManager
    from execstate.state.block_pool import BlockPool


class KVEventsHost(Protocol):
    """What :func:`attach_kv_events` needs of the engine (``LLMEngine`` is one)."""

    config: EngineConfig
    block_pool: BlockPool
    kv_manager: KVCacheManager


def attach_kv_events(engine: KVEventsHost) -> KVEvents | None:
    cfg = engine.config.kv_events
    if cfg is None or not cfg.publishes:
        return None
    publisher = ZmqEventPublisher(cfg)
    events = KVEvents(publisher, engine.config.block_size)
    engine.kv_manager.events = events
    engine.block_pool.set_evict_observer(events.pool_removed)
    weakref.finalize(engine, publisher.close)  # the sockets close with the engine
    return events


class KVEvents:
    """Pending events (a lock: the tiers report from their own threads) and the publisher."""

    def __init__(self, publisher: ZmqEventPublisher, block_size: int) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self._pending: list[KVCacheEvent] = []
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return self.publisher.endpoint

    @property
    def replay_endpoint(self) -> str | None:
        return self.publisher.replay_endpoint

    def stored(self, keys: Sequence[BlockKey], parent: BlockKey | None, token_ids: Sequence[int],
               weights_version: str, medium: str = POOL) -> None:
        """``keys`` became findable in ``medium``: one chain after ``parent``, ``block_size``
        tokens per key in ``token_ids``."""
        if len(token_ids) != len(keys) * self.block_size:
            raise ValueError(f"{len(keys)} blocks need {len(keys) * self.block_size} token ids, got {len(token_ids)}")
        event = BlockStored([bytes(k) for k in keys], None if parent is None else bytes(parent),
                            [int(t) for t in token_ids], self.block_size, None, medium, weights_version)
        with self._lock:
            self._pending.append(event)

    def pool_removed(self, keys: list[BlockKey]) -> None:
        """``BlockPool`` eviction observer."""
        self.units_removed(POOL, keys)

    def unit_stored(self, medium: str, key: BlockKey, record: UnitRecord | None) -> None:
        """A tier holds ``key`` now (``UnitEvents``; any thread). ``record`` None (a tier could
        not read it): the event names the key alone (no parent, no tokens, no version)."""
        if record is None:
            event = BlockStored([bytes(key)], None, [], self.block_size, None, medium, None)
        else:
            event = BlockStored([bytes(key)], bytes(record.parent), list(record.token_ids), self.block_size,
                                None, medium, record.weights_version)
        with self._lock:
            self._pending.append(event)

    def units_removed(self, medium: str, keys: Sequence[BlockKey]) -> None:
        """``keys`` left ``medium`` (``UnitEvents``, the pool's evictions; any thread)."""
        if not keys:
            return
        event = BlockRemoved([bytes(k) for k in keys], medium)
        with self._lock:
            self._pending.append(event)

    def flush(self) -> int:
        """Publish what was recorded since the last flush as one batch; the number of events.
        Any thread; the publisher's queue takes it without blocking."""
        with self._lock:
            events, self._pending = self._pending, []
            if events:
                self.publisher.publish(KVEventBatch(time.time(), events))
        return len(events)

    def close(self) -> None:
        self.flush()
        self.publisher.close()
