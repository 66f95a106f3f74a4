"""Malformed and out-of-order messages over a real socket: each gets an ``error`` with the
offending message's event_id and the right code, and the connection keeps working; the abuse
limits answer and close with the documented codes; nothing leaks."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from realtime_helpers import client, open_session, slow_steps, wait_released
from websockets.exceptions import ConnectionClosed

from execstate.serve.realtime.limits import MAX_MESSAGE_BYTES, MAX_UNPROCESSED_MESSAGES

NO_SESSION = [
    ({"type": "response.create", "event_id": "a"}, "a", "no_session"),
    ({"type": "event.submit", "event_id": 3, "kind": "input", "data": {"token_ids": [1]}}, 3, "no_session"),
    ({"type": "session.checkpoint", "event_id": "b"}, "b", "no_session"),
    ({"type": "session.close", "event_id": "c"}, "c", "no_session"),
    ({"type": "response.cancel", "event_id": "d"}, "d", "no_session"),
    ({"type": "session.resume", "event_id": "e", "session_id": "nobody"}, "e", "not_found"),
    ({"type": "session.resume", "event_id": "e2", "session_id": "bad id!"}, "e2", "not_found"),
    ({"type": "session.create", "event_id": "f", "session": {"sampling": {"temperature": -1}}}, "f", "invalid"),
    ({"type": "session.create", "event_id": "g", "session": {"sampling": {"n": 2}}}, "g", "invalid"),
    ({"type": "session.create", "event_id": "h", "session": {"sampling": {"seed": 2**70}}}, "h", "invalid"),
    ({"type": "session.create", "event_id": "i", "session": {"id": "x y"}}, "i", "invalid"),
    ({"type": "session.create", "event_id": "j", "session": {"priority": 7}}, "j", "invalid"),
    ({"type": "session.create", "event_id": "k", "session": {"max_tokens": 3, "sampling": {"max_tokens": 4}}},
     "k", "invalid"),
    ({"type": "session.create", "event_id": "l", "session": {"sampling": {"logit_bias": {"x": 1}}}}, "l", "invalid"),
    ({"type": "session.create", "event_id": "m", "session": {"cache_salt": ""}}, "m", "invalid"),
    ({"type": "session.create", "event_id": "n", "sesion": {}}, "n", "invalid_message"),  # typo: not ignored
]
FRAMES = [
    ("not json", None, "invalid_message"),
    ("[1, 2]", None, "invalid_message"),
    (json.dumps({"event_id": "o"}), "o", "unknown_type"),
    (json.dumps({"type": "session.explode", "event_id": 9}), 9, "unknown_type"),
    (json.dumps({"type": "event.submit", "event_id": "7", "kind": "input"}), "7", "invalid_message"),
    (b"\x00\x01binary", None, "invalid_message"),
]
WITH_SESSION = [
    ({"type": "session.create", "event_id": "p"}, "p", "session_exists"),
    ({"type": "session.resume", "event_id": "q", "session_id": "errs"}, "q", "session_exists"),
    ({"type": "response.cancel", "event_id": "r"}, "r", "no_response"),
    ({"type": "response.create", "event_id": "s"}, "s", "invalid"),  # empty context: the first step needs input
    ({"type": "response.create", "event_id": "t", "input": {"foo": 1}}, "t", "invalid"),
    ({"type": "response.create", "event_id": "u", "input": {"token_ids": [10**9]}}, "u", "invalid"),
    ({"type": "response.create", "event_id": "v", "input": {"token_ids": [1]}, "max_tokens": 0}, "v", "invalid"),
    ({"type": "event.submit", "event_id": 5, "kind": "input", "data": {"token_ids": [4]}}, 5, None),
    ({"type": "event.submit", "event_id": 3, "kind": "input", "data": {"token_ids": [4]}}, 3, "stale"),
    ({"type": "event.submit", "event_id": 6, "kind": "teleport", "data": {}}, 6, "invalid"),
    ({"type": "event.submit", "event_id": 6, "kind": "sampling", "data": {"temperature": "hot"}}, 6, "invalid"),
    ({"type": "event.submit", "event_id": 6, "kind": "composite", "data": {"events": [
        {"kind": "input", "data": {"token_ids": [4]}}, {"kind": "input", "data": {"token_ids": [-1]}}]}}, 6, "invalid"),
    ({"type": "event.submit", "event_id": -1, "kind": "input", "data": {"token_ids": [4]}}, -1, "invalid"),
    ({"type": "session.rollback", "event_id": "w", "checkpoint_id": "cp-9"}, "w", "not_found"),
    ({"type": "session.fork", "event_id": "x", "checkpoint_id": "cp-9"}, "x", "not_found"),
    ({"type": "session.fork", "event_id": "y", "session_id": "errs"}, "y", "invalid"),  # id in use
]


def test_every_bad_message_gets_its_error_and_the_connection_goes_on(served):
    async def main():
        async with client(served.url) as c:
            for msg, event_id, code in NO_SESSION:
                err = await c.ask(msg)
                assert (err["type"], err["event_id"], err["error"]["code"]) == ("error", event_id, code), msg
                assert err["error"]["message"]
            for frame, event_id, code in FRAMES:
                err = await c.ask(frame)
                assert (err["type"], err["event_id"], err["error"]["code"]) == ("error", event_id, code), frame
            await open_session(c, id="errs", sampling={"temperature": 0, "ignore_eos": True}, max_tokens=2)
            for msg, event_id, code in WITH_SESSION:
                answer = await c.ask(msg)
                assert answer["event_id"] == event_id, msg
                if code is None:
                    assert answer["type"] != "error", answer
                else:
                    assert (answer["type"], answer["error"]["code"]) == ("error", code), (msg, answer)
            for frame, event_id, code in FRAMES:  # with a session too
                err = await c.ask(frame)
                assert (err["event_id"], err["error"]["code"]) == (event_id, code)
            # still working. As offline, response.create's input is an event submitted before the
            # step starts: "v" (max_tokens 0) queued its input as event 0 before the step was refused
            _, _, done = await c.respond(input={"token_ids": [7, 8]})
            assert done["response"]["events"]["started"] == [0, 5, 6]
            assert (await c.ask({"type": "session.close", "event_id": "z"}))["type"] == "session.closed"
            err = await c.ask({"type": "session.get", "event_id": "after-close"})
            assert err["error"]["code"] == "no_session"

    asyncio.run(main())
    wait_released(served.sessions)


def test_backpressure_from_the_session_event_queue(served):
    async def main():
        async with client(served.url) as c:
            await open_session(c, max_tokens=1)
            limit = served.engine.call(lambda e: e.config.max_session_events)
            for i in range(limit):
                await c.send({"type": "event.submit", "event_id": i, "kind": "sampling", "data": {"temperature": 0}})
            for i in range(limit):
                ack = await c.recv()
                assert (ack["type"], ack["event_id"]) == ("event.accepted", i)
            err = await c.ask({"type": "event.submit", "event_id": limit, "kind": "sampling", "data": {"top_k": 2}})
            assert (err["event_id"], err["error"]["code"]) == (limit, "backpressure")

    asyncio.run(main())
    wait_released(served.sessions)


def test_too_large_message_is_refused_and_the_connection_stays(served):
    async def main():
        async with client(served.url) as c:
            big = json.dumps({"type": "event.submit", "event_id": 1, "kind": "input",
                              "data": {"text": "x" * (MAX_MESSAGE_BYTES + 10)}})
            err = await c.ask(big)
            assert (err["type"], err["event_id"], err["error"]["code"]) == ("error", None, "message_too_large")
            # just under the character count but over the byte count (multi-byte characters)
            err = await c.ask(json.dumps({"type": "session.get", "pad": "é" * (MAX_MESSAGE_BYTES // 2)},
                                         ensure_ascii=False))
            assert err["error"]["code"] == "message_too_large"
            await open_session(c)

    asyncio.run(main())
    wait_released(served.sessions)


def test_too_many_unprocessed_messages_closes_with_1008(served):
    """While every message needs an engine round trip and each engine step takes 0.2 s, a flood of
    messages overflows the unprocessed bound: one error, then close code 1008; the server lives on."""

    async def main():
        async with client(served.url) as c:
            await open_session(c, sampling={"ignore_eos": True}, max_tokens=50)
            await c.ask({"type": "response.create", "input": {"token_ids": [5, 6, 7]}})
            for _ in range(MAX_UNPROCESSED_MESSAGES + 50):
                await c.send({"type": "session.get"})
            events = []
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    events.append(await c.recv())
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
            errors = [e for e in events if e["type"] == "error"]
            assert [e["error"]["code"] for e in errors] == ["too_many_messages"]
            assert events[-1] is errors[0]  # the last event before the close frame

    with slow_steps(served.engine, 0.2):
        asyncio.run(main())
    wait_released(served.sessions)
    assert httpx.get(served.url + "/health").status_code == 200
