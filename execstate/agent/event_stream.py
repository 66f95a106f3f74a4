"""The bounded stream of an agent's events to its client (text agents and voice agents alike).

Contract: :meth:`EventStream.emit` never blocks. Once ``max_events`` events wait unread, the
client is not keeping up: the stream queues one ``ErrorEvent`` ``overflow`` (unless the agent was
already closed), calls ``on_overflow`` once (the agent closes itself) and drops every later
event. :meth:`end` ends :meth:`events` after the events queued before it. One event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from execstate.agent.agent_events import AgentEvent, ErrorEvent

_END = object()


class EventStream:
    def __init__(self, max_events: int, closed: Callable[[], bool], on_overflow: Callable[[], None]) -> None:
        self.max_events = max_events
        self._closed, self._on_overflow = closed, on_overflow
        self._queue: asyncio.Queue[object] = asyncio.Queue()

    def emit(self, ev: AgentEvent) -> None:
        if self._queue.qsize() >= self.max_events:
            if not self._closed():
                self._on_overflow()
                self._queue.put_nowait(ErrorEvent(ev.t, ev.epoch, "overflow", "events were not consumed"))
            return
        self._queue.put_nowait(ev)

    def end(self) -> None:
        self._queue.put_nowait(_END)

    async def events(self) -> AsyncIterator[AgentEvent]:
        """Every event, in order, until :meth:`end`."""
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            assert isinstance(item, AgentEvent)
            yield item
