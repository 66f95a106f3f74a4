"""A small client for the agent WebSocket tests (``websockets`` against a real uvicorn) and the
checks every end-to-end test makes on the events a connection received."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

RECV_TIMEOUT_S = 60.0  # a loaded 2-core machine
Event = dict[str, Any]


def agent_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://", 1) + "/v1/realtime/agent"


class AgentClient:
    """Sends messages; a reader task collects every server event (``events``, with arrival times)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[Event] = []
        self.arrived: list[float] = []
        self.log: list[tuple[str, Any]] = []
        self._new = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for frame in self.ws:
            event = json.loads(frame)
            async with self._new:
                self.events.append(event)
                self.arrived.append(time.perf_counter())
                self.log.append(("<", event))
                self._new.notify_all()

    async def send(self, msg: Event | str) -> float:
        self.log.append((">", msg))
        t = time.perf_counter()
        await self.ws.send(json.dumps(msg) if isinstance(msg, dict) else msg)
        return t

    async def wait_for(self, pred: Callable[[Event], bool], after: int = 0, timeout: float = RECV_TIMEOUT_S) -> Event:
        """The first event at index >= ``after`` that satisfies ``pred`` (waiting for it)."""
        async def find() -> Event:
            async with self._new:
                while True:
                    for e in self.events[after:]:
                        if pred(e):
                            return e
                    if self._reader.done():
                        raise AssertionError(f"the socket closed; events: {self.events[after:]}")
                    await self._new.wait()
        return await asyncio.wait_for(find(), timeout)

    async def ask(self, msg: Event, answer: str | None = None) -> Event:
        """Send ``msg``; the first event that echoes its ``event_id`` (of type ``answer`` if given)."""
        n = len(self.events)
        await self.send(msg)
        return await self.wait_for(lambda e: e.get("event_id") == msg.get("event_id")
                                   and (answer is None or e["type"] == answer), n)

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e["type"] == kind]

    async def close(self) -> None:
        await self.ws.close()
        await asyncio.wait({self._reader})


@asynccontextmanager
async def agent_client(http_url: str, **kw: Any) -> AsyncIterator[AgentClient]:
    async with connect(agent_url(http_url), max_size=None, **kw) as ws:
        c = AgentClient(ws)
        try:
            yield c
        finally:
            c._reader.cancel()


async def open_agent(c: AgentClient, **session: Any) -> Event:
    event = await c.ask({"type": "session.create", "event_id": "open", "session": session})
    assert event["type"] == "session.created", event
    return event["session"]


def check_stream(events: list[Event]) -> None:
    """The fence over the wire: every response has exactly one response.done, after its created;
    no delta of a response after its done; deltas concatenate to the done's output_text (a
    cancelled response: what was emitted before it); no output of an old epoch after a newer
    epoch's event."""
    created: dict[str, int] = {}
    done: dict[str, Event] = {}
    text: dict[str, list[str]] = {}
    for e in events:
        if e["type"] == "response.created":
            rid = e["response"]["id"]
            assert rid not in created, f"{rid} created twice"
            created[rid] = e["epoch"]
            text[rid] = []
        elif e["type"] == "response.output_text.delta":
            rid = e["response_id"]
            assert rid in created and rid not in done, f"delta of {rid} outside its life: {e}"
            assert e["epoch"] == created[rid]
            text[rid].append(e["delta"])
        elif e["type"] == "response.done":
            rid = e["response"]["id"]
            assert rid in created and rid not in done, f"{rid}: a second or orphan response.done"
            assert e["response"]["status"] in ("completed", "cancelled", "failed")
            done[rid] = e
            assert "".join(text[rid]) == e["response"]["output_text"]
    epochs = [e["epoch"] for e in events if e["type"] in ("response.output_text.delta", "response.created")]
    assert epochs == sorted(epochs), "output of an old epoch after a newer one"
