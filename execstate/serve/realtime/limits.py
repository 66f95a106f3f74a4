"""The bounds of one realtime connection (docs/contracts.md 8: everything is bounded, and a bound says so).

Each protocol gives its :class:`Limits` (``RealtimeProtocol.limits``); the framework enforces them
the same way for all (``endpoint.py``):

- a text frame over ``max_message_bytes`` is dropped unread and answered with an ``error``
  (``message_too_large``); the connection stays open;
- a frame whose JSON nests deeper than ``max_json_depth`` is answered ``invalid_message`` before
  any decoder sees it (``serve/json_depth.py``; ``messages.py``); the connection stays open;
- more than ``max_unprocessed_messages`` received messages, or ``max_unprocessed_bytes`` of them
  (``None``: no byte bound), not yet taken by the processor: an ``error`` (``too_many_messages``),
  then close code 1008 (policy violation);
- more than ``max_unsent_events`` server events not yet written (a client that does not read):
  producers wait (back-pressure), so such a client only slows itself down.

A frame over ``MAX_FRAME_BYTES`` (16 MiB: uvicorn's ``ws_max_size``, which ``execstate serve`` sets
for the whole server) is refused by the WebSocket layer itself with close code 1009.
"""

from __future__ import annotations

from dataclasses import dataclass

from execstate.serve.json_depth import MAX_JSON_DEPTH

MAX_MESSAGE_BYTES = 1 << 20
MAX_FRAME_BYTES = 16 << 20
MAX_UNPROCESSED_MESSAGES = 256
MAX_UNPROCESSED_BYTES = 8 << 20
MAX_UNSENT_EVENTS = 1024
CLOSE_POLICY_VIOLATION = 1008
WRITER_DRAIN_S = 5.0  # how long the writer may take to flush after the connection ended


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_unprocessed_messages: int = MAX_UNPROCESSED_MESSAGES
    max_unprocessed_bytes: int | None = MAX_UNPROCESSED_BYTES
    max_unsent_events: int = MAX_UNSENT_EVENTS
    max_json_depth: int = MAX_JSON_DEPTH

    def __post_init__(self) -> None:
        sizes = (self.max_message_bytes, self.max_unprocessed_messages, self.max_unsent_events, self.max_json_depth,
                 1 if self.max_unprocessed_bytes is None else self.max_unprocessed_bytes)
        if min(sizes) < 1:
            raise ValueError(f"every realtime limit must be >= 1, got {self}")

    def too_many_messages(self) -> str:
        """The ``too_many_messages`` error's text."""
        bound = f"{self.max_unprocessed_messages} messages"
        if self.max_unprocessed_bytes is not None:
            bound += f" or {self.max_unprocessed_bytes} bytes"
        return f"more than {bound} are waiting to be processed; closing the connection"
