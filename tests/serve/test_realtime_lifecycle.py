"""Who holds a realtime session: a dropped connection's sessions survive ``realtime_grace_s`` for
``session.resume`` and are closed (everything released) when it expires; a session attached to a
live connection cannot be resumed; the API key applies to the WebSocket (header or subprotocol)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from realtime_helpers import client, open_session, wait_released, ws_url
from serve_helpers import MODEL_NAME, engine_config, running_server
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from execstate import SamplingParams
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.llm_engine import LLMEngine
from execstate.serve.app import build_app

A = [5, 17, 42, 99, 250, 311, 7, 8, 9, 10]
B = [21, 22, 23, 24, 25, 26]
GRACE_S = 5.0


async def until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def graced(served):
    app = build_app(served.engine, MODEL_NAME, realtime_grace_s=GRACE_S, sessions=served.sessions)
    with running_server(app) as (url, _):
        yield url, app


def test_resume_within_the_grace_period_continues_the_session(served, graced, offline):
    url, app = graced
    with offline.open_session(sampling_params=SamplingParams(temperature=0.7, seed=3, max_tokens=5,
                                                             ignore_eos=True)) as s:
        ref = [s.step(A), s.step(B)]

    async def main():
        async with client(url) as c:
            await open_session(c, id="keep-1", sampling={"temperature": 0.7, "seed": 3, "ignore_eos": True},
                               max_tokens=5)
            _, _, done = await c.respond(input={"token_ids": A})
            assert done["response"]["token_ids"] == ref[0].token_ids
            await c.ask({"type": "session.checkpoint"})
            assert (await c.ask({"type": "session.fork", "session_id": "keep-1-fork"}))["type"] == "session.forked"
        # the server notices the close a moment later (a network failure: at the ping timeout)
        await until(lambda: sorted(sid for _, sid in app.state.realtime.owners.detached()) == ["keep-1", "keep-1-fork"])
        async with client(url) as c:
            ack = await c.ask({"type": "session.resume", "event_id": "back", "session_id": "keep-1"})
            assert (ack["type"], ack["event_id"]) == ("session.resumed", "back")
            assert (ack["session"]["step_index"], ack["session"]["checkpoints"]) == (1, ["cp-1"])
            _, _, done = await c.respond(input={"token_ids": B})
            assert done["response"]["token_ids"] == ref[1].token_ids  # the RNG state survived the reconnect
            async with client(url) as other:  # attached to a live connection: not resumable
                err = await other.ask({"type": "session.resume", "event_id": 1, "session_id": "keep-1"})
                assert (err["event_id"], err["error"]["code"]) == (1, "session_in_use")
            assert (await c.ask({"type": "session.close"}))["type"] == "session.closed"
        # the fork was not resumed: its grace period ends, it is closed and releases its blocks
        await until(lambda: app.state.realtime.owners.detached() == [("local", "keep-1-fork")])

    asyncio.run(main())
    t0 = time.monotonic()
    wait_released(served.sessions, timeout=GRACE_S + 30)
    assert time.monotonic() - t0 < GRACE_S + 30
    assert app.state.realtime.owners.num_sessions == 0


def test_expired_session_cannot_be_resumed(served, graced):
    url, app = graced

    async def main():
        async with client(url) as c:
            await open_session(c, id="gone-1", max_tokens=2)
            await c.respond(input={"token_ids": A})
        assert served.engine.call(lambda e: e.block_pool.num_used) > 0  # kept for the grace period
        await asyncio.sleep(GRACE_S)
        await asyncio.to_thread(wait_released, served.sessions, 0, 30)
        async with client(url) as c:
            err = await c.ask({"type": "session.resume", "event_id": "late", "session_id": "gone-1"})
            assert (err["event_id"], err["error"]["code"]) == ("late", "closed")
            await open_session(c, id="gone-1")  # the id is free again

    asyncio.run(main())
    wait_released(served.sessions)


@pytest.fixture(scope="module")
def keyed(served):
    app = build_app(served.engine, MODEL_NAME, api_key="sekret-key", sessions=served.sessions)
    with running_server(app) as (url, _):
        yield url


@pytest.mark.parametrize(("headers", "subprotocols"), [
    ({}, None),
    ({"Authorization": "Bearer wrong"}, None),
    ({"Authorization": "sekret-key"}, None),
    ({}, ["realtime", "openai-insecure-api-key.wrong"]),
    ({}, ["realtime"]),
])
def test_api_key_refused_before_the_upgrade(keyed, headers, subprotocols):
    async def main():
        with pytest.raises(InvalidStatus) as info:
            async with connect(ws_url(keyed), additional_headers=headers, subprotocols=subprotocols):
                pass
        response = info.value.response
        assert response.status_code == 401
        assert json.loads(response.body)["error"]["code"] == "invalid_api_key"

    asyncio.run(main())
    assert httpx.get(keyed + "/health").status_code == 200


@pytest.mark.parametrize(("headers", "subprotocols", "selected"), [
    ({"Authorization": "Bearer sekret-key"}, None, None),
    ({}, ["realtime", "openai-insecure-api-key.sekret-key"], "realtime"),
    ({}, ["openai-insecure-api-key.sekret-key", "realtime", "openai-beta.realtime-v1"], "realtime"),
])
def test_api_key_accepted_by_header_or_subprotocol(served, keyed, headers, subprotocols, selected):
    async def main():
        async with client(keyed, additional_headers=headers, subprotocols=subprotocols) as c:
            assert c.ws.subprotocol == selected
            await open_session(c)

    asyncio.run(main())
    wait_released(served.sessions)


def test_without_route_return_and_after_the_engine_died(model_dir):
    """Routes asked of an engine that does not return them: ``invalid``. After the engine stopped
    serving, every message gets ``engine_dead`` and the connection still answers."""
    engine = AsyncEngine(LLMEngine(engine_config(model_dir, enable_return_routed_experts=False)))
    try:
        with running_server(build_app(engine, MODEL_NAME)) as (url, _):
            async def main():
                async with client(url) as c:
                    err = await c.ask({"type": "session.create", "event_id": 1, "session": {"return_routes": True}})
                    assert (err["event_id"], err["error"]["code"]) == (1, "invalid")
                    assert "--enable-return-routed-experts" in err["error"]["message"]
                    await open_session(c, max_tokens=2)
                    err = await c.ask({"type": "response.create", "event_id": 2, "input": {"token_ids": A},
                                       "return_routes": True})
                    assert (err["event_id"], err["error"]["code"]) == (2, "invalid")
                    _, _, done = await c.respond(input={"token_ids": A})
                    assert "routed_experts" not in done["response"]
                    await asyncio.to_thread(engine.shutdown)
                    for i, msg in enumerate([{"type": "session.get"}, {"type": "response.create"},
                                             {"type": "session.checkpoint"}]):
                        err = await c.ask({**msg, "event_id": f"d{i}"})
                        assert (err["event_id"], err["error"]["code"], err["error"]["type"]) == (
                            f"d{i}", "engine_dead", "server_error")
                    assert httpx.get(url + "/health").status_code == 503

            asyncio.run(main())
    finally:
        engine.shutdown()


def test_a_session_opened_over_http_can_be_resumed(served):
    """A session the realtime endpoint never saw (opened by the HTTP session API, or moved in by a
    migration) is resumable; it then belongs to the connection (closed at its end, grace 0)."""
    r = httpx.post(served.url + "/v1/sessions", json={"session_id": "via-http", "sampling": {"temperature": 0}})
    assert r.status_code == 200, r.text
    step = httpx.post(served.url + "/v1/sessions/via-http/step", json={"input": A, "max_tokens": 3}, timeout=60)
    assert step.status_code == 200, step.text

    async def main():
        async with client(served.url) as c:
            ack = await c.ask({"type": "session.resume", "event_id": "r", "session_id": "via-http"})
            assert (ack["type"], ack["session"]["step_index"], ack["session"]["num_tokens"]) == (
                "session.resumed", 1, len(A) + 3)
            _, _, done = await c.respond(input={"token_ids": B}, max_tokens=2)
            assert done["response"]["step_index"] == 2

    asyncio.run(main())
    wait_released(served.sessions)
    assert httpx.get(served.url + "/v1/sessions/via-http").json()["status"] == "closed"
