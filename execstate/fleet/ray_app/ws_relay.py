"""Frames both ways between a client's WebSocket (in the ingress) and a replica's (docs/fleet.md).

:func:`open_upstream` connects to the replica's own server (the ``websockets`` library: no
compression, no proxy from the environment, a keepalive ping every 20 s); :func:`relay` then runs
two pumps until one side ends:

- client -> replica: each frame the client sends (text or binary) is sent to the replica before the
  next is read; the replica's socket buffers at most ``write_limit`` (32 KiB) before ``send``
  waits, so a replica that does not read slows its client, never the ingress's memory;
- replica -> client: each frame the replica sends is handed to the client's socket before the next
  is read; the ``websockets`` connection reads ahead at most ``max_queue`` (16) frames, then TCP
  pushes back on the replica (whose own outbox is bounded: ``serve/realtime/outbox.py``).
  Text frames are shown to ``watch`` first (the ingress records sessions from them).

How it ends (:class:`Ended`):

- the client closes: its code (when a close frame may carry it, else 1000) and reason go to the
  replica, which ends the connection as for a direct client;
- the replica closes (a close frame): its code and reason go to the client unchanged;
- the replica is lost (its connection broke without a close frame: killed, crashed, or no pong
  within 20 s): the client's socket is closed with ``CLOSE_REPLICA_LOST`` (1014) and a reason
  naming the replica (``ws_route.lost_reason``). It never hangs.

Imports no Ray (tested against real servers without a cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from execstate.fleet.ray_app.ws_route import CLOSE_REPLICA_LOST, clip_reason, lost_reason, sendable_close_code

OPEN_TIMEOUT_S = 10.0
PING_INTERVAL_S = 20.0
PING_TIMEOUT_S = 20.0
CLOSE_TIMEOUT_S = 5.0
END_TIMEOUT_S = 5.0  # how long the other pump may take to finish once one side ended


@dataclass(frozen=True)
class Ended:
    """Who ended the connection (``client``, ``replica``, or ``lost``: the replica went without a
    close frame) and the close code and reason each side got."""

    by: str
    code: int
    reason: str


async def open_upstream(url: str, headers: list[tuple[str, str]], subprotocols: list[str]) -> ClientConnection:
    """The ingress's connection to a replica's socket at ``url`` (``ws://host:port/path?query``),
    presenting the client's headers (its ``Authorization``) and offered subprotocols (a browser's
    key among them). Raises ``websockets.exceptions.InvalidStatus`` when the replica refuses the
    handshake (401 ...), ``OSError`` / ``TimeoutError`` / ``InvalidHandshake`` when it cannot be reached."""
    offered = [Subprotocol(p) for p in subprotocols]
    return await connect(url, additional_headers=headers, subprotocols=offered or None, compression=None,
                         proxy=None, max_size=None, open_timeout=OPEN_TIMEOUT_S, ping_interval=PING_INTERVAL_S,
                         ping_timeout=PING_TIMEOUT_S, close_timeout=CLOSE_TIMEOUT_S)


async def relay(client: WebSocket, upstream: ClientConnection, replica_id: str,
                watch: Callable[[str], None] | None = None) -> Ended:
    """Pump frames both ways until one side ends; close the other side as the module docstring says."""
    up = asyncio.create_task(_client_to_replica(client, upstream), name="ws-client-to-replica")
    down = asyncio.create_task(_replica_to_client(upstream, client, replica_id, watch), name="ws-replica-to-client")
    try:
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        closed = up.result() if up in done else None
        if closed is not None:  # the client closed (or went)
            code, reason = closed
            with contextlib.suppress(Exception):
                await upstream.close(sendable_close_code(code), clip_reason(reason))
            return Ended("client", code, reason)
        # the replica's side ended (a send to it failed: its reader ends the same way, at once)
        try:
            ended = await asyncio.wait_for(asyncio.shield(down), END_TIMEOUT_S)
        except TimeoutError:
            ended = Ended("lost", CLOSE_REPLICA_LOST, lost_reason(replica_id))
        if ended.by == "client":  # the client went while the replica was sending to it
            with contextlib.suppress(Exception):
                await upstream.close(sendable_close_code(ended.code), clip_reason(ended.reason))
            return ended
        with contextlib.suppress(Exception):  # the client may be gone already
            await client.close(sendable_close_code(ended.code), clip_reason(ended.reason))
        return ended
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)


async def _client_to_replica(client: WebSocket, upstream: ClientConnection) -> tuple[int, str] | None:
    """Frames from the client to the replica; the client's close (code, reason), or None when the
    replica's side broke first."""
    while True:
        message = await client.receive()
        if message["type"] == "websocket.disconnect":
            return int(message.get("code") or 1000), str(message.get("reason") or "")
        text = message.get("text")
        try:
            await upstream.send(text if text is not None else (message.get("bytes") or b""))
        except ConnectionClosed:
            return None


async def _replica_to_client(upstream: ClientConnection, client: WebSocket, replica_id: str,
                             watch: Callable[[str], None] | None) -> Ended:
    """Frames from the replica to the client, until the replica's side ends (module docstring)."""
    while True:
        try:
            frame = await upstream.recv()
        except ConnectionClosed as e:
            if e.rcvd is not None:  # the replica closed: its code and reason, unchanged
                return Ended("replica", e.rcvd.code, e.rcvd.reason)
            return Ended("lost", CLOSE_REPLICA_LOST, lost_reason(replica_id))
        try:
            if isinstance(frame, str):
                if watch is not None:
                    watch(frame)
                await client.send_text(frame)
            else:
                await client.send_bytes(frame)
        except Exception:  # noqa: BLE001 - the client is gone: its pump reports the close
            return Ended("client", 1001, "client gone")
