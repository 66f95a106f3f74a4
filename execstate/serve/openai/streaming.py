"""Server-sent events for streamed responses.

Streams run their engine requests with ``output_kind=DELTA``: each engine output
carries only the new token ids, logprob entries and text, and the engine already holds
back what must not be sent yet (an incomplete UTF-8 sequence; while unfinished, a
suffix that could be the start of a stop string, which the final text will not
contain), flushing it with the finishing output. So a stream forwards each delta as it
comes, and the concatenated deltas equal the non-streamed text. Nothing here grows with
the output length.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>\\n\\n`` (or a raw string such as ``[DONE]``)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n"


class SSEResponse(StreamingResponse):
    """``text/event-stream`` that always closes its iterator, so a client disconnect
    deterministically runs the generator's cleanup (which aborts the requests), and then
    calls ``on_close`` (even if the iterator never started)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None] | None = None) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            try:
                if aclose is not None:
                    await aclose()
            finally:
                if self.on_close is not None:
                    self.on_close()
