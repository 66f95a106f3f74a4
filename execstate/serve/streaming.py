"""Turning cumulative engine outputs into stream deltas, and the SSE response.

The engine returns each completion's *whole* text so far. ``DeltaTracker`` emits only
text that can no longer change: it holds back a trailing U+FFFD (an incomplete UTF-8
sequence the next token may complete) and, while unfinished, any suffix that could be
the start of a stop string (the engine cuts the stop string from the final text). On
the finishing output everything left is flushed, so the concatenated deltas equal the
final text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from execstate.engine.outputs import CompletionOutput, Logprob


class DeltaTracker:
    """Per-choice stream state: text, token ids and logprobs already sent."""

    def __init__(self, stop: list[str] | None) -> None:
        self.stop = stop or []
        self.sent_text = ""
        self.sent_tokens = 0

    def text_delta(self, c: CompletionOutput) -> str:
        text = c.text
        if not text.startswith(self.sent_text):  # detokenisation rewrote sent text: nothing safe to add
            return ""
        if c.finished():
            safe = len(text)
        else:
            safe = len(text.rstrip("\ufffd"))
            safe -= _stop_prefix_len(text[:safe], self.stop)
        if safe <= len(self.sent_text):
            return ""
        delta = text[len(self.sent_text) : safe]
        self.sent_text = text[:safe]
        return delta

    def token_delta(self, c: CompletionOutput) -> tuple[list[int], list[dict[int, Logprob]] | None]:
        """New token ids (and their logprob entries) since the last call."""
        start = self.sent_tokens
        self.sent_tokens = len(c.token_ids)
        logprobs = c.logprobs[start:] if c.logprobs is not None else None
        return c.token_ids[start:], logprobs


def _stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


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
