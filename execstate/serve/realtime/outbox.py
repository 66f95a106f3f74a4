"""A connection's unsent items, in order, with back-pressure: many producers, one writer.

``put`` waits while ``max_items`` are unsent (a client that does not read slows its own producers
down, nothing else) and drops items once the outbox stopped accepting; ``get`` hands the writer
the next item. ``close_with`` queues a last item and a :class:`CloseFrame`; ``finish`` lets the
writer end after what is queued; ``abandon`` (the socket is gone) drops everything and releases
waiting producers.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class CloseFrame:
    code: int
    reason: str


class Outbox(Generic[T]):
    def __init__(self, max_items: int) -> None:
        self._items: collections.deque[T | CloseFrame] = collections.deque()
        self._max = max_items
        self._accepting = True
        self._cond = asyncio.Condition()

    async def put(self, item: T) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._accepting or len(self._items) < self._max)
            if self._accepting:
                self._items.append(item)
                self._cond.notify_all()

    async def get(self) -> T | CloseFrame | None:
        """The next item; ``None`` once the outbox stopped accepting and is empty."""
        async with self._cond:
            await self._cond.wait_for(lambda: bool(self._items) or not self._accepting)
            if not self._items:
                return None
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    async def close_with(self, item: T, code: int, reason: str) -> None:
        """Send what is queued, then ``item``, then a close frame; drop every later ``put``."""
        async with self._cond:
            if self._accepting:
                self._items.extend((item, CloseFrame(code, reason)))
                self._accepting = False
                self._cond.notify_all()

    async def finish(self) -> None:
        """No more items: the writer ends once the queued ones are sent."""
        async with self._cond:
            self._accepting = False
            self._cond.notify_all()

    async def abandon(self) -> None:
        """The socket is gone: drop everything, release waiting producers."""
        async with self._cond:
            self._accepting = False
            self._items.clear()
            self._cond.notify_all()
