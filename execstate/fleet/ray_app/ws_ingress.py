"""The fleet ingress's realtime WebSockets: each connection proxied to one replica (docs/fleet.md).

:meth:`FleetSockets.serve` is the ingress's WebSocket route for every path of ``ws_route.WS_PATHS``:

1. **Which replica.** ``/v1/realtime``: the socket is accepted (subprotocol ``realtime`` when
   offered, as a replica selects it) and its first client message read: a ``session.resume`` of a
   session the ingress knows (opened over HTTP or over a socket through it) goes to the replica
   holding it; anything else is placed by the fleet's router (``place``: the engine deployment's
   ``RequestRouter``, by load; the message has no prompt). The agent and voice sockets are placed by
   the router at the handshake (each opens a new agent), before the client's socket is accepted.
2. **Connect.** The ingress opens its own socket to that replica's server (``ws_relay.open_upstream``)
   with the client's path, query, headers (``Authorization`` included) and offered subprotocols (a
   browser's ``openai-insecure-api-key.<key>`` included): the replica authenticates the client as
   it would directly. A replica that refuses the handshake (401 ...) refuses the client: the same
   HTTP answer where the server in front can send one (``websocket.http.response``) and the socket
   is not accepted yet, else close code 1008 (401/403) or 1011 with the refusal's message. A replica
   that cannot be reached is excluded and another chosen (at most ``MAX_ATTEMPTS``; a session's
   replica gone: the next replica answers, ``not_found`` for the session); none left: close code
   ``CLOSE_NO_REPLICA`` (1013).
3. **Relay** (``ws_relay.relay``): frames both ways, close codes and reasons through, a replica lost
   mid-connection closes the client's socket with 1014. On ``/v1/realtime`` the replica's
   ``session.created`` / ``session.resumed`` / ``session.forked`` record the session's replica in the
   ingress's ``SessionOwners`` (with the connection's credential), ``session.closed`` forgets it, so
   the session's HTTP calls (``/v1/sessions/{id}...``), a reconnect's ``session.resume`` and a drain
   find it.

Imports no Ray: ``place`` (route -> replica id and URL) is the ingress's (a Ray handle call).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import Response
from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from execstate.fleet.ray_app.prompt_route import SessionOwners, caller_of
from execstate.fleet.ray_app.ws_relay import open_upstream, relay
from execstate.fleet.ray_app.ws_route import (
    CLOSE_NO_REPLICA,
    LM_PATH,
    accepted_subprotocol,
    clip_reason,
    first_frame_route,
    forwarded_headers,
    needs_first_frame,
    session_change,
    ws_credential,
)
from execstate.fleet.router.policy import RouteRequest

logger = logging.getLogger("execstate.fleet")
MAX_ATTEMPTS = 3
CLOSE_POLICY_VIOLATION = 1008
CLOSE_INTERNAL_ERROR = 1011
Place = Callable[[RouteRequest], Awaitable[tuple[str, str]]]  # route -> (replica id, its HTTP base URL)


class NoReplica(Exception):
    """No replica could take the connection (all tried were unreachable)."""


class FleetSockets:
    """The WebSocket side of one ingress: ``place`` picks a replica, ``owners`` is the ingress's
    session map, ``draining`` the replicas new connections avoid. ``opened`` counts the connections
    each replica took, ``open`` those relayed now."""

    def __init__(self, place: Place, owners: SessionOwners, draining: set[str],
                 record: Callable[[str, str, str, str | None], None] | None = None) -> None:
        """``record(caller, session id, replica, credential)`` notes a session a socket opened or
        resumed (the ingress adds the replica's engine id and the tenant, which a resume after the
        replica's loss needs); by default only the replica is recorded in ``owners``."""
        self.place = place
        self.owners = owners
        self.record = record or (lambda caller, sid, replica, cred: owners.set(caller, sid, replica, cred))
        self.draining = draining
        self.opened: Counter[str] = Counter()
        self.open = 0

    async def serve(self, ws: WebSocket) -> None:
        path, query = ws.url.path, ws.url.query
        offered = list(ws.scope.get("subprotocols") or [])
        headers = forwarded_headers(list(ws.headers.items()))
        credential = ws_credential(ws.headers.get("authorization"), offered)
        caller = caller_of(credential)
        accepted, first = False, None
        route = RouteRequest()
        if needs_first_frame(path):
            await ws.accept(subprotocol=accepted_subprotocol(offered))
            accepted = True
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            first = message.get("text") if message.get("text") is not None else message.get("bytes")
            route = first_frame_route(first, caller, self.owners)
        try:
            replica, upstream = await self._connect(route, path + (f"?{query}" if query else ""), headers, offered)
        except InvalidStatus as e:
            await _refuse(ws, accepted, e.response.status_code, bytes(e.response.body or b""), e.response.headers)
            return
        except NoReplica as e:
            logger.warning("websocket %s: %s", path, e)
            if not accepted:
                await ws.accept(subprotocol=accepted_subprotocol(offered))
            await ws.close(CLOSE_NO_REPLICA, clip_reason(str(e)))
            return
        self.opened[replica] += 1
        self.open += 1
        try:
            if not accepted:
                await ws.accept(subprotocol=upstream.subprotocol)
            if first is not None:
                with contextlib.suppress(ConnectionClosed):  # a replica gone at once: the relay reports it
                    await upstream.send(first)
            watch = self._recorder(caller, replica, credential) if path == LM_PATH else None
            ended = await relay(ws, upstream, replica, watch)
            if ended.by == "lost":
                logger.warning("websocket %s: replica %s lost mid-connection", path, replica)
        finally:
            self.open -= 1
            with contextlib.suppress(Exception):
                await upstream.close()

    async def _connect(self, route: RouteRequest, target: str, headers: list[tuple[str, str]],
                       offered: list[str]) -> tuple[str, ClientConnection]:
        """The replica chosen for ``route`` and the ingress's socket to it (module docstring, 2)."""
        excluded = set(self.draining)
        tried: list[str] = []
        for _ in range(MAX_ATTEMPTS):
            r = RouteRequest(route.token_ids, route.scope, route.session_replica, tuple(sorted(excluded)))
            try:
                replica, base = await self.place(r)
            except Exception as e:  # noqa: BLE001 - the chosen replica died before answering: choose again
                tried.append(f"placing: {type(e).__name__}")
                route = RouteRequest(route.token_ids, route.scope)
                continue
            url = base.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + target
            try:
                return replica, await open_upstream(url, headers, offered)
            except InvalidStatus:
                raise
            except (OSError, TimeoutError, InvalidHandshake) as e:
                logger.warning("websocket %s: replica %s unreachable (%r); choosing another", target, replica, e)
                tried.append(f"{replica}: {type(e).__name__}")
                excluded.add(replica)
                route = RouteRequest(route.token_ids, route.scope)  # its session, if any, is gone with it
        raise NoReplica(f"no replica could take the connection ({'; '.join(tried)})")

    def _recorder(self, caller: str, replica: str, credential: str | None) -> Callable[[str], None]:
        def watch(frame: str) -> None:
            change = session_change(frame)
            if change is None:
                return
            if change.held:
                self.record(caller, change.session_id, replica, credential)
            else:
                self.owners.drop(caller, change.session_id)

        return watch


async def _refuse(ws: WebSocket, accepted: bool, status: int, body: bytes, headers: Any) -> None:
    """The replica refused the handshake: the client is refused the same way (module docstring, 2)."""
    if not accepted and "websocket.http.response" in (ws.scope.get("extensions") or {}):
        kept = {k: v for k, v in headers.raw_items() if k.lower() in ("content-type", "www-authenticate")}
        await ws.send_denial_response(Response(body, status, kept))
        return
    # (closing before the upgrade refuses it; after, it closes the accepted socket)
    code = CLOSE_POLICY_VIOLATION if status in (401, 403) else CLOSE_INTERNAL_ERROR
    await ws.close(code, clip_reason(_message(body, status)))


def _message(body: bytes, status: int) -> str:
    """The refusal's message (an OpenAI error body's ``error.message``), else its status."""
    try:
        message = json.loads(body)["error"]["message"]
        return str(message)
    except (ValueError, KeyError, TypeError):
        return f"the replica refused the connection (HTTP {status})"
