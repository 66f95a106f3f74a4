"""KV cache events of one engine: recorded where the cache changes, published once per step.

:func:`build_kv_events` (called once by ``LLMEngine.__init__``, first of the connectors) returns
None unless ``EngineConfig.kv_events`` publishes; else a :class:`KVEvents` the engine gives, at
their construction, to the only two places where the pool's prefix-cache map changes:

- ``KVCacheManager(events=...)``: ``commit`` reports each run of blocks it registered
  (``BlockPool.commit`` returned True) as one ``BlockStored`` (keys, parent key: the identity's
  root for a prompt's first block, the weights version; token ids only when the operator opted in);
- ``BlockPool(evict_observer=events.pool_removed)``: ``allocate`` reports the cached blocks it
  evicted as one ``BlockRemoved``.

So the set of keys a subscriber holds for medium ``pool`` equals the pool's cache map after each
step (the fleet tests rebuild it and compare). Events are collected on the engine thread and
handed to the publisher (``state/kv_events/publisher.py``) as one batch at the end of each
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

Privacy (``KVEventsConfig``): a feed names keys, never tokens, unless ``include_token_ids``; the
blocks of a tenant in ``exclude_tenants`` are never mentioned: neither stored nor removed (the keys
held back are remembered per medium until they leave it, so the memory is bounded by the tiers'
capacity). A tier unit whose tenant is unknown (written before it was recorded) is held back too
when any tenant is excluded. The feed's sockets are private unless secured (``auth.py``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from typing import Protocol

from execstate.identity.keys import BlockKey
from execstate.identity.scope import CacheScope
from execstate.identity.secret_ring import SecretRing
from execstate.state.kv_events.config import KVEventsConfig
from execstate.state.kv_events.events import POOL, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from execstate.state.kv_events.publisher import ZmqEventPublisher


class UnitFacts(Protocol):
    """What an event reads of a tier's unit record (``state/tiers/unit.py``'s ``UnitRecord``: the
    tiers sit beside this package and report to it, so it names no tier type)."""

    @property
    def tenant(self) -> str | None: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def parent(self) -> bytes: ...
    @property
    def weights_version(self) -> str | None: ...


class KVEventsSettings(Protocol):
    """The engine's settings :func:`build_kv_events` reads (``EngineConfig`` is one)."""

    @property
    def kv_events(self) -> KVEventsConfig | None: ...

    @property
    def block_size(self) -> int: ...


def build_kv_events(config: KVEventsSettings, owner: object) -> KVEvents | None:
    """The engine's KV events, or None when its config publishes none; the publisher's sockets
    close when ``owner`` (the engine) is garbage-collected."""
    cfg = config.kv_events
    if cfg is None or not cfg.publishes:
        return None
    publisher = ZmqEventPublisher(cfg, ring=SecretRing.resolve())
    events = KVEvents(publisher, config.block_size, cfg.include_token_ids, cfg.exclude_tenants)
    weakref.finalize(owner, publisher.close)  # the sockets close with the engine
    return events


class KVEvents:
    """Pending events (a lock: the tiers report from their own threads) and the publisher."""

    def __init__(self, publisher: ZmqEventPublisher, block_size: int, include_token_ids: bool = False,
                 exclude_tenants: Sequence[str] = ()) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self.include_token_ids = include_token_ids
        self.exclude_tenants = frozenset(exclude_tenants)
        self._hidden: dict[str, set[bytes]] = {}  # medium -> keys held back while it holds them
        self._pending: list[BlockStored | BlockRemoved | AllBlocksCleared] = []  # KVEventBatch.events
        self._lock = threading.Lock()

    def _hides(self, tenant: str | None) -> bool:
        return bool(self.exclude_tenants) and (tenant is None or tenant in self.exclude_tenants)

    @property
    def endpoint(self) -> str:
        return self.publisher.endpoint

    @property
    def replay_endpoint(self) -> str | None:
        return self.publisher.replay_endpoint

    def stored(self, keys: Sequence[BlockKey], parent: BlockKey | None, token_ids: Sequence[int],
               weights_version: str, scope: CacheScope, medium: str = POOL) -> None:
        """``keys`` became findable in ``medium``: one chain after ``parent``, ``block_size``
        tokens per key in ``token_ids``, computed for ``scope``'s tenant."""
        if len(token_ids) != len(keys) * self.block_size:
            raise ValueError(f"{len(keys)} blocks need {len(keys) * self.block_size} token ids, got {len(token_ids)}")
        with self._lock:
            if self._hides(scope.tenant):
                self._hidden.setdefault(medium, set()).update(bytes(k) for k in keys)
                return
            tokens = [int(t) for t in token_ids] if self.include_token_ids else []
            self._pending.append(BlockStored([bytes(k) for k in keys], None if parent is None else bytes(parent),
                                             tokens, self.block_size, None, medium, weights_version))

    def pool_removed(self, keys: list[BlockKey]) -> None:
        """``BlockPool`` eviction observer."""
        self.units_removed(POOL, keys)

    def unit_stored(self, medium: str, key: BlockKey, record: UnitFacts | None) -> None:
        """A tier holds ``key`` now (``UnitEvents``; any thread). ``record`` None (a tier could
        not read it): the event names the key alone (no parent, no tokens, no version)."""
        with self._lock:
            if self._hides(None if record is None else record.tenant):
                self._hidden.setdefault(medium, set()).add(bytes(key))
                return
            if record is None:
                event = BlockStored([bytes(key)], None, [], self.block_size, None, medium, None)
            else:
                tokens = list(record.token_ids) if self.include_token_ids else []
                event = BlockStored([bytes(key)], bytes(record.parent), tokens, self.block_size, None, medium,
                                    record.weights_version)
            self._pending.append(event)

    def units_removed(self, medium: str, keys: Sequence[BlockKey]) -> None:
        """``keys`` left ``medium`` (``UnitEvents``, the pool's evictions; any thread)."""
        if not keys:
            return
        with self._lock:
            hidden = self._hidden.get(medium)
            shown = [bytes(k) for k in keys]
            if hidden:
                shown = [k for k in shown if k not in hidden]
                hidden.difference_update(bytes(k) for k in keys)
            if shown:
                self._pending.append(BlockRemoved(shown, medium))

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
