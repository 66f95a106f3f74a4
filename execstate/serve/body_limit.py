"""Request body size limit (``--max-request-bytes``): 413 before the body is parsed.

A pure ASGI middleware. A body announced larger than the limit (``Content-Length``) is
refused before any of it is read; a body without a length (chunked) is read up to the
limit and refused as soon as it goes beyond. An accepted body is handed to the app
from memory, exactly as received; later ``receive`` calls (the disconnect the app
may wait for) go to the server as before. Only methods that carry a body are read.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from execstate.serve.errors import OpenAIError, bad_request

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: int | None) -> OpenAIError:
        told = f" ({size} bytes)" if size is not None else ""
        return OpenAIError(
            413, f"the request body{told} is larger than the {self.max_bytes} bytes this server accepts "
            "(--max-request-bytes)", code="request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None:
            if not length.isdigit():
                await bad_request(f"invalid Content-Length {length!r}").response()(scope, receive, send)
                return
            if int(length) > self.max_bytes:
                await self._too_large(int(length)).response()(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(None).response()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
