"""A replica's weights-version gate: every request runs, start to end, on the version it read.

``EngineReplica.forward`` holds a *reading* pass for the whole request (from before it reaches
the engine until its last chunk) and reads the weights version inside it; ``update_weights``
holds the *writing* pass while the engine switches. A writer waits for the passes held, and new
readers wait while a writer waits or holds (writer preference), so no request straddles a switch
and the version a request read is the one that served it. This is what the engine's ``drain``
policy does anyway (requests in flight finish on the old weights first); the gate adds that the
replica knows which version each request got. One asyncio loop (the replica's); pure Python.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class VersionGate:
    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False  # a writer holds or waits

    @property
    def readers(self) -> int:
        return self._readers

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer)
            self._writer = True
            await self._cond.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._writer = False
                self._cond.notify_all()
