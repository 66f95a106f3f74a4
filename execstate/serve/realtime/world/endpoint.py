"""``/v1/realtime/video`` (world sessions) and the ``/world`` browser page.

One connection, three tasks, as ``/v1/realtime`` (``realtime.py``): the endpoint *reads* frames
and queues them; a *processor* hands them one at a time to ``WorldConnection.handle``
(``world_conn.py``); a *writer* is the only one that sends: JSON events as text frames and each
chunk as its ``video.chunk_metadata`` text frame immediately followed by its binary frame.

Abuse limits (everything else gets an ``error`` event and the connection stays open): a text frame
over ``MAX_MESSAGE_BYTES`` (64 KiB) is answered with ``message_too_large``; more than
``MAX_UNPROCESSED_MESSAGES`` received and not yet processed: ``too_many_messages``, then close
code 1008; more than ``MAX_UNSENT`` items not yet written (a client that does not read): the
session's stepper waits, so such a client only slows its own session down.

When the socket goes, the message being handled is finished, the rest dropped, and the session is
released (``WorldConnection.close``): its KV blocks go back, its place among the resident sessions
is free.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from starlette.websockets import WebSocket

from execstate.serve.realtime import CloseFrame, Outbox
from execstate.serve.world_conn import WorldConnection
from execstate.serve.world_driver import WorldHost
from execstate.serve.world_protocol import MAX_MESSAGE_BYTES, WorldProtocolError, error_event

PATH = "/v1/realtime/video"
PAGE_PATH = "/world"
SUBPROTOCOL = "realtime"
MAX_UNPROCESSED_MESSAGES = 256
MAX_UNSENT = 64
CLOSE_POLICY_VIOLATION = 1008
WRITER_DRAIN_S = 5.0

logger = logging.getLogger(__name__)
_ENCODER = msgspec.json.Encoder()


# What the writer sends: a JSON event, and a chunk's payload (a binary frame) after it, if any.
_Item = tuple[dict[str, Any], bytes | None]


class WorldServer:
    """The world endpoint of one app: its ``WorldHost`` and the number of open connections."""

    def __init__(self, host: WorldHost) -> None:
        self.host = host
        self.num_connections = 0

    async def endpoint(self, ws: WebSocket) -> None:
        offered = ws.scope.get("subprotocols") or []  # a browser offers the API key as for /v1/realtime
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        self.num_connections += 1
        outbox: Outbox[_Item] = Outbox(MAX_UNSENT)

        async def emit(event: dict[str, Any]) -> None:
            await outbox.put((event, None))

        async def emit_chunk(meta: dict[str, Any], payload: bytes) -> None:
            await outbox.put((meta, payload))

        conn = WorldConnection(self.host, emit, emit_chunk)
        inbox: asyncio.Queue[tuple[str | bytes, bool, WorldProtocolError | None] | None] = asyncio.Queue()
        writer = asyncio.create_task(_write(ws, outbox))
        processor = asyncio.create_task(_process(conn, inbox))
        try:
            await _read(ws, inbox, outbox)
        finally:
            await asyncio.shield(self._end(conn, inbox, processor, outbox, writer))

    async def _end(self, conn: WorldConnection, inbox: asyncio.Queue[Any], processor: asyncio.Task[None],
                   outbox: Outbox[_Item], writer: asyncio.Task[None]) -> None:
        conn.state.gone()
        inbox.put_nowait(None)
        await asyncio.wait({processor})
        await conn.close()
        await outbox.finish()
        try:
            await asyncio.wait_for(writer, WRITER_DRAIN_S)
        except TimeoutError:
            logger.debug("world: the client did not read its last events")
        self.num_connections -= 1


async def _read(ws: WebSocket, inbox: asyncio.Queue[Any], outbox: Outbox[_Item]) -> None:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        error = None
        if text is None:
            item: tuple[str | bytes, bool, WorldProtocolError | None] = (b"", True, None)
        elif len(text) > MAX_MESSAGE_BYTES:
            error = WorldProtocolError("message_too_large", f"a message is at most {MAX_MESSAGE_BYTES} bytes, "
                                       f"got {len(text.encode())}")
            item = ("", False, error)
        else:
            item = (text, False, None)
        if inbox.qsize() >= MAX_UNPROCESSED_MESSAGES:
            err = error_event("too_many_messages", f"more than {MAX_UNPROCESSED_MESSAGES} messages are waiting to be "
                              "processed; closing the connection")
            await outbox.close_with((err, None), CLOSE_POLICY_VIOLATION, "too many unprocessed messages")
            return
        inbox.put_nowait(item)


async def _process(conn: WorldConnection, inbox: asyncio.Queue[Any]) -> None:
    while (item := await inbox.get()) is not None:
        frame, binary, error = item
        if error is not None:
            await conn.reject(error)
        else:
            await conn.handle(frame, binary)


async def _write(ws: WebSocket, outbox: Outbox[_Item]) -> None:
    try:
        while (item := await outbox.get()) is not None:
            if isinstance(item, CloseFrame):
                await ws.close(item.code, item.reason)
                return
            event, payload = item
            await ws.send_text(_ENCODER.encode(event).decode())
            if payload is not None:
                await ws.send_bytes(payload)
    except Exception as exc:  # noqa: BLE001 - the client is gone: nothing more can be sent
        logger.debug("world: send failed: %r", exc)
    finally:
        await outbox.abandon()


def page_html() -> str:
    return resources.files("execstate.serve").joinpath("static/world.html").read_text()


def install_world(app: FastAPI, host: WorldHost) -> WorldServer:
    """Serve ``/v1/realtime/video`` and ``/world`` (+ ``/world.js``) on ``app`` (``app.state.world``)."""
    server = WorldServer(host)
    app.state.world = server
    app.add_api_websocket_route(PATH, server.endpoint)
    html = page_html()
    script = resources.files("execstate.serve").joinpath("static/world.js").read_text()

    @app.get(PAGE_PATH, include_in_schema=False)
    async def world_page() -> HTMLResponse:
        return HTMLResponse(html)

    @app.get(PAGE_PATH + ".js", include_in_schema=False)
    async def world_script() -> Response:
        return Response(script, media_type="text/javascript")

    return server
