"""A realtime protocol served on a WebSocket route: the socket loop, written once for every protocol.

One connection, three tasks: the endpoint's own task *reads* frames and queues them (enforcing the
protocol's ``Limits``: ``limits.py``); a *processor* hands them, one at a time and in arrival
order, to ``Connection.handle`` (``connection.py``); a *writer* is the only one that sends
(``Outbox``: events in the order they were produced as JSON text frames, an event's binary payload
right after it). So the reader keeps reading while a handler's work streams, and no two sends
interleave.

The subprotocol is the protocol's (``realtime``) when the client offers it. Authentication is the
app's, before the upgrade (``serve/auth.py``'s ``APIKeyMiddleware``: a refused client gets an HTTP
401, never an accepted socket; browsers offer ``openai-insecure-api-key.<key>`` as a subprotocol).
The key's tenant is the connection's principal for its whole life (``Peer.tenant``).

When the socket goes (closed by either side, or past a limit), the message being handled is
finished, the rest is dropped, ``Connection.close`` releases what the connection holds (a failure
there is logged), and the writer flushes for at most ``WRITER_DRAIN_S``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec
from fastapi import FastAPI
from starlette.websockets import WebSocket

from execstate.serve.auth import scope_tenant
from execstate.serve.realtime.connection import Connection, Handlers, Peer
from execstate.serve.realtime.errors import ProtocolError
from execstate.serve.realtime.limits import CLOSE_POLICY_VIOLATION, WRITER_DRAIN_S
from execstate.serve.realtime.outbox import CloseFrame, Outbox
from execstate.serve.realtime.protocol import RealtimeProtocol

logger = logging.getLogger(__name__)
_ENCODER = msgspec.json.Encoder()


class OutFrame(NamedTuple):
    event: dict[str, Any]
    payload: bytes | None  # a binary frame sent right after the event


@dataclass(frozen=True)
class _Frame:
    frame: str | bytes
    binary: bool
    size: int
    error: ProtocolError | None = None


class _Pending:
    """Messages and bytes received and not yet taken by the processor."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0


class Endpoint:
    """One protocol's WebSocket endpoint of one app: ``serve`` is the route (``mount``)."""

    def __init__(self, protocol: RealtimeProtocol, open_handlers: Callable[[Peer], Handlers]) -> None:
        self.protocol = protocol
        self.open_handlers = open_handlers
        self.num_connections = 0

    async def serve(self, ws: WebSocket) -> None:
        p = self.protocol
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=p.subprotocol if p.subprotocol in offered else None)
        self.num_connections += 1
        outbox: Outbox[OutFrame] = Outbox(p.limits.max_unsent_events)

        async def emit(event: dict[str, Any]) -> None:
            await outbox.put(OutFrame(event, None))

        async def emit_binary(event: dict[str, Any], payload: bytes) -> None:
            await outbox.put(OutFrame(event, payload))

        conn = Connection(p, self.open_handlers, emit, emit_binary, scope_tenant(ws.scope))
        inbox: asyncio.Queue[_Frame | None] = asyncio.Queue()
        pending = _Pending()
        writer = asyncio.create_task(self._write(ws, outbox))
        processor = asyncio.create_task(_process(conn, inbox, pending))
        try:
            await self._read(ws, inbox, pending, outbox)
        finally:
            await asyncio.shield(self._end(conn, inbox, processor, outbox, writer))

    async def _read(self, ws: WebSocket, inbox: asyncio.Queue[_Frame | None], pending: _Pending,
                    outbox: Outbox[OutFrame]) -> None:
        """Queue frames until the socket closes or a limit is crossed (``limits.py``)."""
        limits = self.protocol.limits
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                item = _Frame(b"", True, 0)  # binary frames are refused; their content is not needed
            elif len(text) > limits.max_message_bytes:  # characters <= bytes: surely too large
                item = _Frame("", False, 0, ProtocolError(
                    "message_too_large", f"a message is at most {limits.max_message_bytes} bytes, "
                    f"got {len(text.encode())}"))
            else:
                item = _Frame(text, False, len(text))
            if pending.messages >= limits.max_unprocessed_messages or (
                    limits.max_unprocessed_bytes is not None
                    and pending.bytes + item.size > limits.max_unprocessed_bytes):
                err = self.protocol.error_event(ProtocolError("too_many_messages", limits.too_many_messages()), {})
                await outbox.close_with(OutFrame(err, None), CLOSE_POLICY_VIOLATION, "too many unprocessed messages")
                return
            pending.messages += 1
            pending.bytes += item.size
            inbox.put_nowait(item)

    async def _write(self, ws: WebSocket, outbox: Outbox[OutFrame]) -> None:
        try:
            while (item := await outbox.get()) is not None:
                if isinstance(item, CloseFrame):
                    await ws.close(item.code, item.reason)
                    return
                await ws.send_text(_ENCODER.encode(item.event).decode())
                if item.payload is not None:
                    await ws.send_bytes(item.payload)
        except Exception as exc:  # noqa: BLE001 - the client is gone: nothing more can be sent
            logger.debug("%s: send failed: %r", self.protocol.name, exc)
        finally:
            await outbox.abandon()

    async def _end(self, conn: Connection, inbox: asyncio.Queue[_Frame | None], processor: asyncio.Task[None],
                   outbox: Outbox[OutFrame], writer: asyncio.Task[None]) -> None:
        conn.disconnected()
        inbox.put_nowait(None)
        await asyncio.wait({processor})
        try:
            await conn.close()
        except Exception:  # noqa: BLE001 - a failed close must not keep the connection counted
            logger.exception("%s: closing a dropped connection failed", self.protocol.name)
        await outbox.finish()
        try:
            await asyncio.wait_for(writer, WRITER_DRAIN_S)
        except TimeoutError:
            logger.debug("%s: the client did not read its last events", self.protocol.name)
        self.num_connections -= 1


async def _process(conn: Connection, inbox: asyncio.Queue[_Frame | None], pending: _Pending) -> None:
    while (item := await inbox.get()) is not None:
        pending.messages -= 1
        pending.bytes -= item.size
        if item.error is not None:
            await conn.reject(item.error)
        else:
            await conn.handle(item.frame, item.binary)


def mount(app: FastAPI, path: str, endpoint: Endpoint) -> Endpoint:
    """Serve ``endpoint`` on ``app`` at the WebSocket route ``path``."""
    app.add_api_websocket_route(path, endpoint.serve)
    return endpoint
