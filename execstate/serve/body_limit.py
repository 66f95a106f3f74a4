"""Request body bounds: size (``--max-request-bytes``: 413) and JSON depth (400), before parsing.

A pure ASGI middleware. A body announced larger than the limit (``Content-Length``) is
refused before any of it is read; a body without a length (chunked) is read up to the
limit and refused as soon as it goes beyond. An accepted body is handed to the app
from memory, exactly as received; later ``receive`` calls (the disconnect the app
may wait for) go to the server as before. Only methods that carry a body are read.

A JSON body (``Content-Type`` ``application/json``, ``...+json``, or none: FastAPI reads those as
JSON) nested deeper than ``max_json_depth`` levels is refused with 400 (``code``
``invalid_message``) before any decoder recurses through it (``json_depth.py``); other bodies (the
msgpack of a session import) are not JSON and are not measured.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from execstate.serve.errors import OpenAIError, bad_request
from execstate.serve.json_depth import MAX_JSON_DEPTH, depth_message, too_deep

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, max_json_depth: int = MAX_JSON_DEPTH) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_json_depth = max_json_depth

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
        body = b"".join(chunks)
        depth = too_deep(body, self.max_json_depth) if _is_json(scope) else None
        if depth is not None:
            err = OpenAIError(400, f"malformed JSON body: {depth_message(depth, self.max_json_depth)}",
                              code="invalid_message")
            await err.response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)


def _is_json(scope: Scope) -> bool:
    kind = Headers(scope=scope).get("content-type", "").split(";", 1)[0].strip().lower()
    return not kind or kind == "application/json" or kind.endswith("+json")


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
