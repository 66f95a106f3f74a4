"""``/v1/realtime``: the realtime WebSocket (messages: ``realtime_protocol.py``; docs/realtime.md).

One connection, three tasks: the endpoint's own task *reads* frames and queues them; a
*processor* hands them, one at a time and in arrival order, to ``RealtimeConnection.handle``
(``realtime_conn.py``); a *writer* is the only one that sends (``Outbox``: events in the order
they were produced, JSON text frames). So the reader keeps reading while a response streams
(``response.cancel`` and ``event.submit`` act mid-step) and no two sends interleave.

Subprotocol: ``realtime`` is selected when the client offers it (browsers offer it with
``openai-insecure-api-key.<key>``, as for OpenAI's Realtime API; the key is checked by
``auth.APIKeyMiddleware`` before the upgrade: 401, never an accepted socket).

Abuse limits (everything else gets an ``error`` event and the connection stays open):

- a frame over ``MAX_MESSAGE_BYTES`` (1 MiB) is dropped unread and answered with
  ``message_too_large``; a frame over ``MAX_FRAME_BYTES`` (16 MiB, uvicorn's ``ws_max_size``,
  which ``serve`` sets) is refused by the WebSocket layer with close code 1009;
- more than ``MAX_UNPROCESSED_MESSAGES`` (256) received messages, or ``MAX_UNPROCESSED_BYTES``
  (8 MiB) of them, not yet taken by the processor: an ``error`` (``too_many_messages``), then close
  code 1008 (policy violation);
- more than ``MAX_UNSENT_EVENTS`` server events not yet written (a client that does not read):
  producers wait, so such a client only slows itself down (the engine keeps running).

When the socket goes (closed by either side, or the limits above), the message being handled is
finished, the rest is dropped, the response in progress is cancelled and the connection's
sessions are closed, or kept detached for ``--realtime-grace-s`` seconds (``realtime_registry.py``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
from fastapi import FastAPI
from starlette.websockets import WebSocket

from execstate.serve.context import ServeContext
from execstate.serve.realtime_conn import RealtimeConnection
from execstate.serve.realtime_protocol import MAX_MESSAGE_BYTES, ProtocolError, error_event
from execstate.serve.realtime_registry import SessionOwners
from execstate.session.async_sessions import AsyncSessions

PATH = "/v1/realtime"
SUBPROTOCOL = "realtime"
DEFAULT_GRACE_S = 0.0
MAX_FRAME_BYTES = 16 << 20
MAX_UNPROCESSED_MESSAGES = 256
MAX_UNPROCESSED_BYTES = 8 << 20
MAX_UNSENT_EVENTS = 1024
CLOSE_POLICY_VIOLATION = 1008
WRITER_DRAIN_S = 5.0  # how long the writer may take to flush after the connection ended

logger = logging.getLogger(__name__)
_ENCODER = msgspec.json.Encoder()


T = TypeVar("T")


@dataclass(frozen=True)
class CloseFrame:
    code: int
    reason: str


class Outbox(Generic[T]):
    """The connection's unsent items (server events, or whatever its writer sends), in order; one
    writer ``get``\\ s them. ``put`` waits while ``max_events`` are unsent and drops items once the
    outbox stopped accepting. Used by every WebSocket endpoint (``/v1/realtime``, ``/agent``,
    ``/video``)."""

    def __init__(self, max_events: int) -> None:
        self._items: collections.deque[T | CloseFrame] = collections.deque()
        self._max = max_events
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


@dataclass(frozen=True)
class _Frame:
    frame: str | bytes
    binary: bool
    size: int
    error: ProtocolError | None = None


class RealtimeServer:
    """The realtime endpoint of one app: its ``AsyncSessions`` and the sessions' owners."""

    def __init__(self, ctx: ServeContext, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.ctx = ctx
        self.sessions = AsyncSessions(ctx.engine)
        self.owners = SessionOwners(self.sessions.close, grace_s)
        self.num_connections = 0

    async def endpoint(self, ws: WebSocket) -> None:
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        self.num_connections += 1
        outbox: Outbox[dict[str, Any]] = Outbox(MAX_UNSENT_EVENTS)
        conn = RealtimeConnection(self.sessions, self.owners, outbox.put, self.ctx.in_worker)
        inbox: asyncio.Queue[_Frame | None] = asyncio.Queue()
        pending = [0, 0]  # messages, bytes received and not yet taken by the processor
        writer = asyncio.create_task(_write(ws, outbox))
        processor = asyncio.create_task(_process(conn, inbox, pending))
        try:
            await _read(ws, inbox, pending, outbox)
        finally:
            await asyncio.shield(self._end(conn, inbox, processor, outbox, writer))

    async def _end(self, conn: RealtimeConnection, inbox: asyncio.Queue[_Frame | None], processor: asyncio.Task[None],
                   outbox: Outbox[dict[str, Any]], writer: asyncio.Task[None]) -> None:
        conn.disconnected()
        inbox.put_nowait(None)
        await asyncio.wait({processor})
        await conn.close()
        await outbox.finish()
        try:
            await asyncio.wait_for(writer, WRITER_DRAIN_S)
        except TimeoutError:
            logger.debug("realtime: the client did not read its last events")
        self.num_connections -= 1


async def _read(ws: WebSocket, inbox: asyncio.Queue[_Frame | None], pending: list[int], outbox: Outbox[dict[str, Any]]) -> None:
    """Queue frames until the socket closes or a limit is crossed (module docstring)."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is not None:
            item = _Frame(text, False, len(text))
            if len(text) > MAX_MESSAGE_BYTES:  # characters <= bytes: surely too large
                item = _Frame("", False, 0, ProtocolError(
                    "message_too_large", f"a message is at most {MAX_MESSAGE_BYTES} bytes, got {len(text.encode())}"))
        else:
            item = _Frame(b"", True, 0)  # binary frames are refused; their content is not needed
        if pending[0] >= MAX_UNPROCESSED_MESSAGES or pending[1] + item.size > MAX_UNPROCESSED_BYTES:
            err = error_event("too_many_messages", f"more than {MAX_UNPROCESSED_MESSAGES} messages or "
                              f"{MAX_UNPROCESSED_BYTES} bytes are waiting to be processed; closing the connection")
            await outbox.close_with(err, CLOSE_POLICY_VIOLATION, "too many unprocessed messages")
            return
        pending[0] += 1
        pending[1] += item.size
        inbox.put_nowait(item)


async def _process(conn: RealtimeConnection, inbox: asyncio.Queue[_Frame | None], pending: list[int]) -> None:
    while (item := await inbox.get()) is not None:
        pending[0] -= 1
        pending[1] -= item.size
        if item.error is not None:
            await conn.reject(item.error)
        else:
            await conn.handle(item.frame, item.binary)


async def _write(ws: WebSocket, outbox: Outbox[dict[str, Any]]) -> None:
    try:
        while (item := await outbox.get()) is not None:
            if isinstance(item, CloseFrame):
                await ws.close(item.code, item.reason)
                return
            await ws.send_text(_ENCODER.encode(item).decode())
    except Exception as exc:  # noqa: BLE001 - the client is gone: nothing more can be sent
        logger.debug("realtime: send failed: %r", exc)
    finally:
        await outbox.abandon()


def install_realtime(app: FastAPI, ctx: ServeContext, grace_s: float = DEFAULT_GRACE_S) -> RealtimeServer:
    """Serve ``/v1/realtime`` on ``app`` (``app.state.realtime`` is the ``RealtimeServer``)."""
    server = RealtimeServer(ctx, grace_s)
    app.state.realtime = server
    app.add_api_websocket_route(PATH, server.endpoint)
    return server
