"""The fleet ingress's WebSocket side without Ray: ``FleetSockets`` behind a real uvicorn, its
``place`` a function of the test choosing among real servers (what Ray's router does in the fleet:
tests/fleet/test_ray_fleet_ws.py).

- Relay mechanics against a small server run as a process (``ws_upstream_app.py``): frames both
  ways (text, binary), the handshake's Authorization, query and subprotocols forwarded, close codes
  and reasons through in both directions, an unreachable replica skipped, none reachable: 1013, a
  replica SIGKILLed mid-connection: the client's socket closed with 1014 naming it, at once;
  back-pressure: a client that does not read stops the replica's sending.
- The LM realtime socket against two real execstate servers of the tiny MoE with an API key:
  frames through the proxy equal a direct connection's, the key by header or browser subprotocol
  works and a wrong one is refused, sessions opened over the socket are recorded on their server
  and a ``session.resume`` (a reconnect, or a session opened over HTTP) goes to the server holding it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))
sys.path.insert(0, str(Path(__file__).parent))

from serve_helpers import MODEL_NAME, engine_config, free_port, running_server, write_tokenizer  # noqa: E402
from ws_helpers import TIMEOUT, lm_ws, normalized, play, recv_json  # noqa: E402

from execstate.engine.async_engine import AsyncEngine  # noqa: E402
from execstate.engine.llm_engine import LLMEngine  # noqa: E402
from execstate.fleet.ray_app.prompt_route import SessionReplicas, caller_of  # noqa: E402
from execstate.fleet.ray_app.ws_ingress import FleetSockets  # noqa: E402
from execstate.fleet.ray_app.ws_route import WS_PATHS  # noqa: E402
from execstate.fleet.router.policy import RouteRequest  # noqa: E402
from execstate.model.random_models import make_random  # noqa: E402
from execstate.serve.app import build_app  # noqa: E402

KEY = "sk-fleet-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
UPSTREAM = Path(__file__).parent / "ws_upstream_app.py"


class Placer:
    """The test's stand-in for the fleet's router: a session's server when the route names one
    that is not excluded, else the next server of ``order`` not excluded. Records every route."""

    def __init__(self, servers: dict[str, str], order: list[str]) -> None:
        self.servers = servers
        self.order = order
        self.routes: list[RouteRequest] = []
        self._next = 0

    async def __call__(self, route: RouteRequest) -> tuple[str, str]:
        self.routes.append(route)
        if route.session_replica in self.servers and route.session_replica not in route.exclude:
            return route.session_replica, self.servers[route.session_replica]
        free = [r for r in self.order if r not in route.exclude] or self.order
        rid = free[self._next % len(free)]
        self._next += 1
        return rid, self.servers[rid]


def proxy_app(sockets: FleetSockets) -> Starlette:
    return Starlette(routes=[WebSocketRoute(p, sockets.serve) for p in WS_PATHS])


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


# -- relay mechanics against a small server in a process ---------------------------------------------


@pytest.fixture
def upstream() -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(UPSTREAM), str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url + "/state", timeout=1)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline and proc.poll() is None, "the upstream server did not start"
            time.sleep(0.05)
    yield url, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def agent_ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/realtime/agent"


def test_frames_headers_and_close_codes_pass_through(upstream):
    url, _ = upstream
    placer = Placer({"up": url}, ["up"])
    sockets = FleetSockets(placer, SessionReplicas(), set())
    with running_server(proxy_app(sockets)) as (proxy, _):
        async def main():
            async with connect(agent_ws(proxy) + "?model=m&x=1", additional_headers=AUTH,
                               subprotocols=["openai-insecure-api-key.k2", "realtime"]) as ws:
                assert ws.subprotocol == "realtime"
                hello = await recv_json(ws)
                assert hello == {"type": "hello", "authorization": f"Bearer {KEY}", "query": "model=m&x=1",
                                 "subprotocols": ["openai-insecure-api-key.k2", "realtime"]}
                for text in ("a", "ü" * 5000, "{\"type\": \"x\"}"):
                    await ws.send(text)
                    assert await asyncio.wait_for(ws.recv(), TIMEOUT) == "echo:" + text
                await ws.send(b"\x00\x01\x02\xff")
                assert await asyncio.wait_for(ws.recv(), TIMEOUT) == b"\xff\x02\x01\x00"
                assert sockets.open == 1
                await ws.send("close:4001:the replica says bye")
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), TIMEOUT)
                assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "the replica says bye")

            async with connect(agent_ws(proxy)) as ws:
                await recv_json(ws)
                await ws.close(4002, "the client is done")
            deadline = time.monotonic() + 10
            while httpx.get(url + "/state").json()["closed"] != [4002, "the client is done"]:
                assert time.monotonic() < deadline, httpx.get(url + "/state").json()
                await asyncio.sleep(0.05)
            assert sockets.opened["up"] == 2
            deadline = time.monotonic() + 10
            while sockets.open:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)

        run(main())
    assert [r.exclude for r in placer.routes] == [(), ()]


def test_an_unreachable_replica_is_skipped_and_none_reachable_closes_1013(upstream):
    url, _ = upstream
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    placer = Placer({"dead": dead, "up": url}, ["dead", "up"])
    with running_server(proxy_app(FleetSockets(placer, SessionReplicas(), set()))) as (proxy, _):
        async def main():
            async with connect(agent_ws(proxy)) as ws:
                assert (await recv_json(ws))["type"] == "hello"
            assert [r.exclude for r in placer.routes] == [(), ("dead",)]
            only_dead = FleetSockets(Placer({"dead": dead}, ["dead"]), SessionReplicas(), set())
            with running_server(proxy_app(only_dead)) as (proxy2, _):
                async with connect(agent_ws(proxy2)) as ws:
                    with pytest.raises(ConnectionClosed) as closed:
                        await asyncio.wait_for(ws.recv(), TIMEOUT)
            assert closed.value.rcvd.code == 1013 and "no replica could take the connection" in closed.value.rcvd.reason

        run(main())


def test_a_replica_killed_mid_connection_closes_the_clients_socket_with_1014(upstream):
    url, proc = upstream
    rid = "SERVE_REPLICA::execstate#EngineReplica#killed1"
    sockets = FleetSockets(Placer({rid: url}, [rid]), SessionReplicas(), set())
    with running_server(proxy_app(sockets)) as (proxy, _):
        async def main():
            async with connect(agent_ws(proxy)) as ws:
                await recv_json(ws)
                await ws.send("still there?")
                assert await asyncio.wait_for(ws.recv(), TIMEOUT) == "echo:still there?"
                os.kill(proc.pid, signal.SIGKILL)
                t0 = time.monotonic()
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), TIMEOUT)
                took = time.monotonic() - t0
            assert closed.value.rcvd.code == 1014
            assert closed.value.rcvd.reason == f"the replica serving this connection failed: {rid}"
            assert took < 5.0  # the broken TCP connection is seen at once (no keepalive wait)

        run(main())
    assert sockets.open == 0


def test_a_client_that_does_not_read_stops_the_replica_sending(upstream):
    url, proc = upstream
    with running_server(proxy_app(FleetSockets(Placer({"up": url}, ["up"]), SessionReplicas(), set()))) as (proxy, _):
        async def main():
            async with connect(agent_ws(proxy), max_size=None, max_queue=4, close_timeout=1) as ws:
                await recv_json(ws)
                n, size = 2000, 65536  # 128 MiB if nothing pushed back
                await ws.send(f"flood:{n}:{size}")
                await asyncio.sleep(1.5)  # the client reads nothing
                first = httpx.get(url + "/state").json()["sent"]
                await asyncio.sleep(0.5)
                second = httpx.get(url + "/state").json()["sent"]
                assert first == second, (first, second)  # stalled: nothing buffers without bound
                # what the kernel's socket buffers hold and a few frames in hand, not 128 MiB
                assert 0 < second * size < 48 * 2**20, second
                for i in range(second + 10):  # reading again resumes the flood, in order
                    frame = await asyncio.wait_for(ws.recv(), TIMEOUT)
                    assert frame[:8] == f"{i:08d}" and len(frame) == size
                assert httpx.get(url + "/state").json()["sent"] > second
                proc.kill()  # (the replica is still flooding: no close handshake to wait for)

        run(main())


# -- the LM realtime socket against real execstate servers -------------------------------------------


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, tuple[str, Any]]]:
    """Two execstate servers of the tiny MoE (API key ``KEY``; a dropped socket's sessions kept 60 s)."""
    model = make_random("qwen3_moe", tmp_path_factory.mktemp("ws_proxy_moe"), seed=0)
    write_tokenizer(model)
    out: dict[str, tuple[str, Any]] = {}
    stack = []
    try:
        for name in ("A", "B"):
            engine = AsyncEngine(LLMEngine(engine_config(model, block_size=4)))
            app = build_app(engine, MODEL_NAME, api_key=KEY, realtime_grace_s=60.0)
            ctx = running_server(app)
            url, _ = ctx.__enter__()
            stack.append((ctx, engine))
            out[name] = (url, app)
        yield out
    finally:
        for ctx, engine in stack:
            ctx.__exit__(None, None, None)
            engine.shutdown()


def test_lm_frames_through_the_proxy_equal_a_direct_connection(servers):
    (a_url, _), (b_url, _) = servers["A"], servers["B"]
    placer = Placer({"A": a_url, "B": b_url}, ["A"])
    sockets = FleetSockets(placer, SessionReplicas(), set())
    with running_server(proxy_app(sockets)) as (proxy, _):
        direct = run(play(lm_ws(b_url), "direct", additional_headers=AUTH))
        proxied = run(play(lm_ws(proxy), "proxied", additional_headers=AUTH))
        browser = run(play(lm_ws(proxy), "browser", subprotocols=[f"openai-insecure-api-key.{KEY}", "realtime"]))
    kinds = [e["type"] for e in direct]
    assert kinds.count("response.delta") >= 2 and kinds[-1] == "session.closed" and "error" in kinds
    assert [normalized(e) for e in proxied] == [normalized(e) for e in direct]
    assert [normalized(e) for e in browser] == [normalized(e) for e in direct]
    done = [e for e in proxied if e["type"] == "response.done"]
    assert [len(d["response"]["token_ids"]) for d in done] == [5, 3]
    assert placer.routes == [RouteRequest(), RouteRequest()]  # session.create: placed by the router


def test_a_wrong_key_is_refused_through_the_proxy(servers):
    placer = Placer({"A": servers["A"][0]}, ["A"])
    with running_server(proxy_app(FleetSockets(placer, SessionReplicas(), set()))) as (proxy, _):
        async def main():
            # /v1/realtime reads the first message before choosing: the socket is accepted, then closed 1008
            async with connect(lm_ws(proxy), additional_headers={"Authorization": "Bearer wrong"}) as ws:
                await ws.send(json.dumps({"type": "session.create"}))
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), TIMEOUT)
            assert closed.value.rcvd.code == 1008 and "Incorrect or missing API key" in closed.value.rcvd.reason
            # the agent socket is placed at the handshake: refused with the server's own HTTP 401
            with pytest.raises(InvalidStatus) as refused:
                async with connect(lm_ws(proxy) + "/agent", subprotocols=["openai-insecure-api-key.wrong"]):
                    pass
            assert refused.value.response.status_code == 401
            assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"

        run(main())


def test_sessions_are_recorded_and_a_resume_goes_to_the_server_holding_it(servers):
    (a_url, _), (b_url, _) = servers["A"], servers["B"]
    placer = Placer({"A": a_url, "B": b_url}, ["A", "B"])  # new connections alternate A, B, A ...
    owners = SessionReplicas()
    sockets = FleetSockets(placer, owners, set())
    me = caller_of(AUTH["Authorization"])
    step = {"type": "response.create", "input": {"token_ids": [7, 8, 9, 10]}, "max_tokens": 2}

    async def respond(ws) -> list[int]:
        await ws.send(json.dumps(step))
        while (event := await recv_json(ws))["type"] != "response.done":
            pass
        return event["response"]["token_ids"]

    with running_server(proxy_app(sockets)) as (proxy, _):
        async def main():
            homes = {}
            for sid in ("ws-1", "ws-2"):  # one lands on A, the other on B
                async with connect(lm_ws(proxy), additional_headers=AUTH) as ws:
                    await ws.send(json.dumps({"type": "session.create", "session": {
                        "id": sid, "sampling": {"temperature": 0, "ignore_eos": True}}}))
                    assert (await recv_json(ws))["type"] == "session.created"
                    await respond(ws)
                    await ws.send(json.dumps({"type": "session.fork", "session_id": sid + "-fork"}))
                    assert (await recv_json(ws))["type"] == "session.forked"
                homes[sid] = owners.get(me, sid)
                assert owners.get(me, sid + "-fork") == homes[sid]  # a fork lives where its parent does
            assert sorted(homes.values()) == ["A", "B"]
            # a session opened over HTTP (the ingress records it: here, as its HTTP side would)
            r = httpx.post(b_url + "/v1/sessions", json={"sampling": {"temperature": 0, "ignore_eos": True}},
                           headers=AUTH, timeout=TIMEOUT)
            assert r.status_code == 200, r.text
            owners.set(me, r.json()["session_id"], "B", AUTH["Authorization"])
            for sid, home in [*homes.items(), (r.json()["session_id"], "B")] * 2:  # reconnects, twice each
                async with connect(lm_ws(proxy), additional_headers=AUTH) as ws:
                    await ws.send(json.dumps({"type": "session.resume", "session_id": sid}))
                    resumed = await recv_json(ws)
                    assert resumed["type"] == "session.resumed", resumed  # another server: not_found
                    assert len(await respond(ws)) == 2
                assert placer.routes[-1] == RouteRequest(session_replica=home)
            # closed over the socket: forgotten
            async with connect(lm_ws(proxy), additional_headers=AUTH) as ws:
                await ws.send(json.dumps({"type": "session.resume", "session_id": "ws-1"}))
                assert (await recv_json(ws))["type"] == "session.resumed"
                await ws.send(json.dumps({"type": "session.close"}))
                assert (await recv_json(ws))["type"] == "session.closed"
            assert owners.get(me, "ws-1") is None and owners.get(me, "ws-2") is not None

        run(main())
