"""Refusing a WebSocket upgrade: an HTTP error response, and one INFO line that says why.

``refuse_websocket(scope, receive, send, error, reason)`` answers the upgrade with ``error`` (an
``OpenAIError``: its status and OpenAI body) where the ASGI server can send an HTTP response
(``websocket.http.response``), else closes it with 1008 before accepting; either way it logs
``websocket refused: <path> from <client>: <reason> (<status>)`` at INFO (logger
``execstate.serve.ws_refusal``). The socket is never accepted.

uvicorn's sans-I/O WebSocket protocol (the one ``--ws auto`` picks) does not count such a denial
response as a completed handshake and logs ``ERROR: ASGI callable returned without completing
handshake.`` for every refused client, which reads like a server fault. The refusal marks its own
task (a context variable: the ASGI call runs in the protocol's task, which logs right after it
returns), and :class:`_DeniedHandshake`, a filter on the ``uvicorn.error`` logger, drops that one
record for marked tasks only: any other connection that ends without a handshake is still
logged as an error.
"""

from __future__ import annotations

import contextvars
import logging

from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from execstate.serve.errors import OpenAIError

CLOSE_POLICY_VIOLATION = 1008
UVICORN_NO_HANDSHAKE = "ASGI callable returned without completing handshake."

logger = logging.getLogger(__name__)
_refused: contextvars.ContextVar[bool] = contextvars.ContextVar("execstate_ws_refused", default=False)


class _DeniedHandshake(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (_refused.get() and record.getMessage() == UVICORN_NO_HANDSHAKE)


_FILTER = _DeniedHandshake()


def install_log_filter() -> None:
    """Add the filter to ``uvicorn.error`` (once; an app that may refuse upgrades calls it when built)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if _FILTER not in uvicorn_log.filters:
        uvicorn_log.addFilter(_FILTER)


async def refuse_websocket(scope: Scope, receive: Receive, send: Send, error: OpenAIError, reason: str) -> None:
    """Refuse the upgrade in ``scope`` (module docstring)."""
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "unknown client"
    logger.info("websocket refused: %s from %s: %s (%d)", scope.get("path", "?"), who, reason, error.status)
    _refused.set(True)
    ws = WebSocket(scope, receive, send)
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await ws.send_denial_response(error.response())
    else:
        await ws.close(CLOSE_POLICY_VIOLATION, reason[:120])
