"""Finding 7: JSON nested 100k deep gave ``server_error`` and a ``RecursionError``
traceback logged per frame. Now every JSON a client sends (the frames of every realtime protocol,
through the framework, and the HTTP API's bodies) is measured before a decoder recurses and
refused beyond ``MAX_JSON_DEPTH`` levels: ``invalid_message`` on the sockets (the connection goes
on), 400 ``invalid_message`` over HTTP, nothing logged as an error."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import msgspec
import pytest
from bounds_server import Raw, bounds_served, connect_raw, error_code  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.serve.realtime.errors import ProtocolError
from execstate.serve.realtime.messages import Message, MessageTable

LIMIT = 64  # MAX_JSON_DEPTH (serve/json_depth.py)
HUGE = 100_000


def nested(depth: int) -> str:
    """A JSON value ``depth`` levels deep (arrays, with an object every 7th level)."""
    out = "0"
    for i in range(depth):
        out = f'{{"k": {out}}}' if i % 7 == 6 else f"[{out}]"
    return out


# A deep value in a field each protocol takes as free-form JSON, so only the depth is wrong; the
# levels of the message around it
OUTER = {"lm": 1, "agent": 3, "world": 3}
DEEP_FRAME = {
    "lm": lambda d: f'{{"type": "event.submit", "event_id": 1, "kind": "input", "data": {d}}}',
    "agent": lambda d: f'{{"type": "session.update", "event_id": "u", "session": {{"sampling": {{"x": {d}}}}}}}',
    "world": lambda d: f'{{"type": "session.interaction", "event_id": "i", "interaction": {{"event": {{"x": {d}}}}}}}',
}


def _no_recursion_logged(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or "RecursionError" in r.getMessage()
           or (r.exc_info and r.exc_info[0] is RecursionError)]
    assert not bad, [r.getMessage()[:200] for r in bad]


@pytest.mark.parametrize("kind", ["lm", "agent", "world"])
def test_every_socket_refuses_deep_json_cleanly(bounds_served, kind, caplog):  # noqa: F811
    caplog.set_level(logging.INFO)

    async def run() -> None:
        async with connect_raw(bounds_served, kind) as ws:
            c = Raw(ws)
            for depth in (HUGE if kind != "world" else 15_000, LIMIT + 1):  # world messages: at most 64 KiB
                event = await c.ask(DEEP_FRAME[kind](nested(depth)))
                assert error_code(event) == "invalid_message", event
                message = event["error"]["message"] if isinstance(event.get("error"), dict) else event["message"]
                assert f"nested {depth + OUTER[kind]} levels deep; at most {LIMIT}" in message, event
            # the connection goes on: a well-formed message is answered as usual
            ping = {"lm": {"type": "session.get", "event_id": "g"}, "agent": {"type": "session.close"},
                    "world": {"type": "session.ping", "event_id": "p"}}[kind]
            answer = await c.ask(ping)
            assert error_code(answer) != "server_error" and answer["type"] in ("error", "session.pong"), answer

    asyncio.run(run())
    _no_recursion_logged(caplog)


def test_http_api_refuses_deep_json_with_400_invalid_message(bounds_served, caplog):  # noqa: F811
    caplog.set_level(logging.INFO)
    url = bounds_served.url
    sid = httpx.post(f"{url}/v1/sessions", json={}, timeout=30).json()["session_id"]
    try:
        for depth in (HUGE, LIMIT + 1):
            deep = nested(depth)
            for path, body in ((f"/v1/sessions/{sid}/events", f'{{"event_id": 1, "kind": "input", "data": {deep}}}'),
                               ("/v1/chat/completions", f'{{"model": "m", "messages": [], "x": {deep}}}'),
                               ("/v1/sessions", f'{{"sampling": {{"logit_bias": {deep}}}}}')):
                r = httpx.post(f"{url}{path}", content=body, headers={"Content-Type": "application/json"}, timeout=30)
                assert r.status_code == 400, (path, depth, r.status_code, r.text[:200])
                err = r.json()["error"]
                assert err["code"] == "invalid_message" and "levels deep; at most 64" in err["message"], err
        # at the bound: the depth is fine (the event itself is judged on its merits)
        ok = httpx.post(f"{url}/v1/sessions/{sid}/events", timeout=30,
                        json={"event_id": 2, "kind": "input", "data": {"token_ids": [1, 2]}})
        assert ok.status_code == 200, ok.text
    finally:
        httpx.delete(f"{url}/v1/sessions/{sid}", timeout=30)
    _no_recursion_logged(caplog)


# -- the framework: every protocol built on it gets the bound --------------------------------------
class Free(Message, tag="free"):
    data: Any = None
    event_id: int | str | None = None


TABLE = MessageTable(Free)


@settings(max_examples=60, deadline=None)
@given(depth=st.one_of(st.integers(0, LIMIT), st.integers(LIMIT + 1, 5 * LIMIT), st.integers(900, 200_000)))
def test_framework_bound_is_exact(depth):
    frame = f'{{"type": "free", "event_id": 7, "data": {nested(depth)}}}'
    total = depth + 1  # the message object itself is a level
    if total <= LIMIT:
        msg = TABLE.decode(frame, 1 << 22)
        assert isinstance(msg, Free) and msg.event_id == 7
    else:
        with pytest.raises(ProtocolError) as e:
            TABLE.decode(frame, 1 << 22)
        assert e.value.code == "invalid_message" and f"nested {total} levels deep" in e.value.message


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), inner,
                                                                 max_size=3),
    max_leaves=30)


def _depth(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_json, st.booleans())
def test_depth_measure_matches_the_parsed_value(value, compact):
    """Brackets, quotes and backslashes inside strings never count (``json_depth`` against the parse)."""
    from execstate.serve.json_depth import json_depth

    text = json.dumps(value, separators=(",", ":") if compact else None)
    assert json_depth(text) == _depth(msgspec.json.decode(text))
