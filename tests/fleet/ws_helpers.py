"""What the fleet's WebSocket tests share: a scripted ``/v1/realtime`` exchange and how two runs of it
compare (the Ray-free proxy tests and the Ray fleet's)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import connect

TIMEOUT = 60.0  # a loaded 2-core machine; an answer normally comes in milliseconds


def lm_ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/realtime"


async def recv_json(ws) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


SCRIPT = [
    {"type": "session.create", "event_id": "c", "session": {"sampling": {"temperature": 0, "ignore_eos": True},
                                                             "max_tokens": 5, "cache_salt": None,
                                                             "return_routes": True}},
    {"type": "response.create", "event_id": "r1", "input": {"token_ids": [5, 17, 42, 99, 250, 311, 7, 8, 9]}},
    {"type": "event.submit", "event_id": 1, "kind": "input", "data": {"text": "hello there"}},
    {"type": "response.create", "event_id": "r2", "max_tokens": 3},
    {"type": "session.get", "event_id": "g"},
    {"type": "bogus"},
    {"type": "session.close", "event_id": "z"},
]
VARIABLE = ("session_id", "id", "response_id", "cache_salt", "branch_id", "state_key")  # differ by salt


def normalized(event: Any) -> Any:
    """An event without what differs between two runs of one script (ids, the salt)."""
    if isinstance(event, dict):
        return {k: normalized(v) for k, v in event.items() if k not in VARIABLE}
    if isinstance(event, list):
        return [normalized(v) for v in event]
    return event


async def play(ws_url: str, salt: str, **kw: Any) -> list[dict[str, Any]]:
    """Run ``SCRIPT`` (a message's answers: one event, or up to its ``response.done`` /
    ``session.closed``) with the session's ``cache_salt`` = ``salt``; every event received."""
    events: list[dict[str, Any]] = []
    async with connect(ws_url, max_size=None, **kw) as ws:
        for msg in SCRIPT:
            if msg["type"] == "session.create":
                msg = {**msg, "session": {**msg["session"], "cache_salt": salt}}
            await ws.send(json.dumps(msg))
            ends = {"response.create": "response.done", "session.close": "session.closed"}.get(msg["type"])
            while True:
                event = await recv_json(ws)
                events.append(event)
                if ends is None or event["type"] == ends:
                    break
    return events
