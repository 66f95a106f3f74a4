"""Where a tier reports the units it starts or stops holding (docs/fleet.md "KV events").

A tier built with a :class:`UnitEvents` (``HostCache``, ``DiskStore``, ``RedisStore``; the
engine passes its ``KVEvents``, ``state/kv_events/recorder.py``) calls it at every change of the set of
units it would answer a lookup for, under the same lock as the change, so the calls of one tier
come in the order of its changes:

- :meth:`UnitEvents.unit_stored`: ``key`` became findable in ``medium`` (DRAM: sealed; disk and
  Redis: entered the tier's index: written, found at start, read from the shared store, adopted);
  ``record`` is the unit's record (parent, tokens, weights version), ``None`` when the tier could
  not read it (a malformed file found at start: the reader will refuse it);
- :meth:`UnitEvents.units_removed`: ``keys`` are no longer findable in ``medium`` (dropped for
  room, discarded after a failed check, found missing).

So a subscriber that applies them in order holds, per medium, exactly the keys of the tier's
index. Implementations must not block and must not call back into the tier (they run with its
lock held, on the engine, write-back or reload thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from execstate.identity.keys import BlockKey
from execstate.state.tiers.unit import UnitRecord


class UnitEvents(Protocol):
    def unit_stored(self, medium: str, key: BlockKey, record: UnitRecord | None) -> None: ...

    def units_removed(self, medium: str, keys: Sequence[BlockKey]) -> None: ...
