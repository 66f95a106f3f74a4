"""The shared tier on a Redis server (``UnitStore``; contract in ``store.py``; docs/offload.md).

One Redis string per unit: key ``<prefix><key hex>``, value the unit's blob (``unit.py``).

- **First writer wins**: ``SET ... NX`` is atomic on the server, so concurrent writers of one key
  (threads, engines, replicas) leave exactly one whole unit.
- **Bounded twice**: this process drops its oldest units (``DEL``) beyond ``capacity_bytes``;
  the server's own ``maxmemory`` may evict more (the reader then finds the unit absent and
  recomputes). A write the server refuses for memory (``OOM``) drops this process's oldest
  units and is retried once (still refused: the unit is dropped, ``full``).
- **Timeouts**: every command is bounded by ``timeout_s`` (socket connect and read). A timeout or
  a connection error marks the tier unavailable for ``backoff_s``; during that time nothing is
  sent to the server and every unit is recomputed. A server stopped mid-run costs at most one
  timeout per ``backoff_s``.
- The index of what is stored is local (units this process wrote or read); a unit another
  replica wrote is found once it is in that index (docs/offload.md: what is left).
- KV events (``events``, medium ``shared``): every change of that local index is reported
  (``unit_events.py``), the record read from the blob's head (``adopt`` reads the first
  ``HEAD_BYTES`` of each value). Units the server itself evicts (``maxmemory``) are reported when
  this process finds them missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import redis

from execstate.identity.keys import BlockKey
from execstate.state.kv_events.events import SHARED
from execstate.state.tiers.stats import TierStats
from execstate.state.tiers.store import Health, UnitIndex, UnitStore
from execstate.state.tiers.unit import UnitRecord, read_record
from execstate.state.tiers.unit_events import UnitEvents

DEFAULT_PREFIX = "execstate:unit:v1:"
_OOM_DROP = 8  # oldest units dropped before retrying a write the server refused for memory
HEAD_BYTES = 4096  # what adopt reads of each value to name it in its event (a record is a few hundred bytes)


class RedisStore(UnitStore):
    def __init__(self, url: str, capacity_bytes: int, policy: str = "lru", timeout_s: float = 1.0,
                 backoff_s: float = 5.0, prefix: str = DEFAULT_PREFIX, name: str = "redis",
                 events: UnitEvents | None = None) -> None:
        self.name = name
        self.url = url
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.index = UnitIndex(capacity_bytes, policy, events, SHARED)
        self.stats = TierStats(name, capacity_bytes)
        self.health = Health(name, self.stats, backoff_s)

    def redis_key(self, key: BlockKey) -> str:
        """The Redis key of a unit."""
        return self.prefix + key.hex()

    def contains(self, key: BlockKey) -> bool:
        return key in self.index and self.health.available()

    def put(self, key: BlockKey, parts: Sequence[bytes | memoryview]) -> bool:
        if key in self.index:
            return False
        if not self.health.available():
            self.stats.dropped("unavailable")
            return False
        blob = b"".join(parts)
        if not self.index.fits(len(blob)):
            self.stats.dropped("full")
            return False
        try:
            try:
                wrote = self.client.set(self.redis_key(key), blob, nx=True)
            except redis.exceptions.OutOfMemoryError:
                self._delete(self._evict_oldest(_OOM_DROP))
                wrote = self.client.set(self.redis_key(key), blob, nx=True)
            self._delete(self.index.add(key, len(blob), self._record(parts[0])))
        except redis.exceptions.OutOfMemoryError:
            self.stats.dropped("full")
            return False
        except redis.ResponseError:
            self.stats.dropped("error")
            return False
        except redis.RedisError as e:
            self.health.failed(f"{type(e).__name__}: {e}")
            self.stats.dropped("unavailable")
            return False
        self.health.succeeded()
        if wrote:
            self.stats.written()
        self._update_size()
        return bool(wrote)

    def get(self, key: BlockKey) -> bytes | None:
        if not self.health.available():
            return None
        try:
            data = cast(bytes | None, self.client.get(self.redis_key(key)))  # no decode_responses
        except redis.RedisError as e:
            self.health.failed(f"{type(e).__name__}: {e}")
            return None
        self.health.succeeded()
        if data is None:
            self.index.remove(key)  # the server evicted or lost it
            self._update_size()
            return None
        if key not in self.index:
            self._delete(self.index.add(key, len(data), self._record(data)))
        else:
            self.index.touch(key)
        self._update_size()
        return data

    def adopt(self, keys: Sequence[BlockKey]) -> int:
        """Index the units among ``keys`` that the server holds (written by another replica: a
        session woken here from the shared tier names its units); how many it holds. One
        round trip; nothing on error (the units are then recomputed)."""
        if not keys or not self.health.available():
            return 0
        heads = self.index.events is not None
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.strlen(self.redis_key(key))
                if heads:
                    pipe.getrange(self.redis_key(key), 0, HEAD_BYTES - 1)
            answers = pipe.execute()
        except redis.RedisError as e:
            self.health.failed(f"{type(e).__name__}: {e}")
            return 0
        sizes = answers[:: 2 if heads else 1]
        found = 0
        for i, (key, size) in enumerate(zip(keys, sizes, strict=True)):
            if size and self.index.fits(int(size)):
                if key not in self.index:
                    self._delete(self.index.add(key, int(size), self._record(answers[2 * i + 1]) if heads else None))
                found += 1
        self._update_size()
        return found

    def discard(self, key: BlockKey) -> None:
        self.index.remove(key)
        self._delete([key], count=False)
        self._update_size()

    def close(self) -> None:
        self.client.close()

    # -- internals --------------------------------------------------------------------------------

    def _record(self, head: bytes | memoryview) -> UnitRecord | None:
        """The record at the head of a blob, for its event (None without events)."""
        return read_record(head) if self.index.events is not None else None

    def _evict_oldest(self, n: int) -> list[BlockKey]:
        keys = self.index.oldest(n)
        for k in keys:
            self.index.remove(k)
        return keys

    def _delete(self, keys: list[BlockKey], count: bool = True) -> None:
        if not keys:
            return
        if count:
            self.stats.dropped("full", len(keys))
        try:
            self.client.delete(*(self.redis_key(k) for k in keys))
        except redis.RedisError as e:  # the server's maxmemory or a restart reclaims them
            self.health.failed(f"{type(e).__name__}: {e}")

    def _update_size(self) -> None:
        self.stats.set_size(len(self.index), self.index.nbytes)
