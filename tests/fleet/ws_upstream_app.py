"""A small WebSocket server the relay tests run as a process (so a test can SIGKILL it), on the agent
socket's path (one the ingress places at the handshake: the server speaks first).

``python ws_upstream_app.py PORT``. Each connection gets a ``hello`` event naming what the
handshake brought (Authorization, query, subprotocols offered); then each text frame is a command:
``close:CODE:REASON`` (the server closes), ``flood:N:SIZE`` (N text frames of SIZE random base64
characters after an 8-digit index, incompressible, each sent once the connection takes it),
anything else is echoed as ``echo:<text>``; a binary frame comes back reversed. ``GET /state``: the
close code and reason the last client sent, and how many flood frames were sent."""

from __future__ import annotations

import base64
import json
import os
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

STATE: dict[str, object] = {"closed": None, "sent": 0}


async def socket(ws: WebSocket) -> None:
    offered = list(ws.scope.get("subprotocols") or [])
    await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    await ws.send_text(json.dumps({"type": "hello", "authorization": ws.headers.get("authorization"),
                                   "query": ws.url.query, "subprotocols": offered}))
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            STATE["closed"] = [message.get("code"), message.get("reason")]
            return
        text = message.get("text")
        if text is None:
            await ws.send_bytes(bytes(reversed(message.get("bytes") or b"")))
            continue
        command = text.split(":")
        if command[0] == "close":
            await ws.close(int(command[1]), command[2])
            return
        if command[0] == "flood":
            STATE["sent"] = 0
            size = int(command[2])
            noise = base64.b64encode(os.urandom(size)).decode()[:size - 8]
            for i in range(int(command[1])):
                await ws.send_text(f"{i:08d}" + noise)
                STATE["sent"] = i + 1
            continue
        await ws.send_text("echo:" + text)


async def state(_request: Request) -> JSONResponse:
    return JSONResponse(STATE)


app = Starlette(routes=[WebSocketRoute("/v1/realtime/agent", socket), Route("/state", state)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
