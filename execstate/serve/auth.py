"""API key check (``--api-key``): ``Authorization: Bearer <key>`` on every ``/v1`` path.

A pure ASGI middleware (runs before body parsing, never wraps streaming responses);
``/health`` and ``/metrics`` stay open, as in vLLM. Keys are compared in constant time.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from execstate.serve.errors import OpenAIError


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and scope["method"] != "OPTIONS":
            given = Headers(scope=scope).get("authorization", "").encode()
            if not hmac.compare_digest(given, self.expected):
                err = OpenAIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                                  code="invalid_api_key")
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
