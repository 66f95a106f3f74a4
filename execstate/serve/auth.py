"""API key check (``--api-key``) on every ``/v1`` path.

HTTP: ``Authorization: Bearer <key>``. WebSocket (``/v1/realtime``): the same header, or, for
browsers (which cannot set headers on a WebSocket), the subprotocol
``openai-insecure-api-key.<key>`` among those offered, as OpenAI's Realtime API accepts it. A
refused WebSocket gets an HTTP 401 with the OpenAI error body before the upgrade (close code
1008 instead where the ASGI server cannot send an HTTP response); its socket is never accepted,
and the refusal is one INFO line with the reason (``ws_refusal.py``).

A pure ASGI middleware (runs before body parsing, never wraps streaming responses);
``/health`` and ``/metrics`` stay open, as in vLLM. Keys are compared in constant time.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from execstate.serve.errors import OpenAIError
from execstate.serve.ws_refusal import CLOSE_POLICY_VIOLATION, install_log_filter, refuse_websocket

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
__all__ = ["CLOSE_POLICY_VIOLATION", "KEY_SUBPROTOCOL_PREFIX", "APIKeyMiddleware"]


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.expected_subprotocol = f"{KEY_SUBPROTOCOL_PREFIX}{api_key}".encode()
        install_log_filter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and scope["method"] != "OPTIONS":
            if not self._header_ok(scope):
                await _refusal("send 'Authorization: Bearer <key>'").response()(scope, receive, send)
                return
        elif (scope["type"] == "websocket" and scope["path"].startswith("/v1")
              and not (self._header_ok(scope) or self._subprotocol_ok(scope))):
            await _refuse_websocket(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _header_ok(self, scope: Scope) -> bool:
        given = Headers(scope=scope).get("authorization", "").encode()
        return hmac.compare_digest(given, self.expected)

    def _subprotocol_ok(self, scope: Scope) -> bool:
        offered = [p.encode() for p in scope.get("subprotocols") or [] if p.startswith(KEY_SUBPROTOCOL_PREFIX)]
        return any([hmac.compare_digest(p, self.expected_subprotocol) for p in offered])


def _refusal(how: str) -> OpenAIError:
    return OpenAIError(401, f"Incorrect or missing API key: {how}", code="invalid_api_key")


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    err = _refusal(f"send 'Authorization: Bearer <key>' or the subprotocol '{KEY_SUBPROTOCOL_PREFIX}<key>'")
    await refuse_websocket(scope, receive, send, err, "invalid API key")
