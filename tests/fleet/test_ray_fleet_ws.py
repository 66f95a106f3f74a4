"""The realtime WebSockets through the fleet's ingress, on a local Ray cluster: 2 engine replicas of
the tiny MoE behind Ray Serve's proxy, the ASGI ingress and the execstate RequestRouter.

- ``/v1/realtime``: a scripted exchange through the ingress gives the frames of a direct connection
  to a replica's own server (a single execstate server), and the offline session's tokens;
- a session opened over HTTP and attached over the socket (``session.resume``) lands on its replica
  (sessions on both replicas; another replica would answer ``not_found``), its steps continue it;
- a session opened over the socket is recorded: its HTTP calls go to the replica holding it
  (``session_in_use``, never another replica's ``not_found``);
- the agent and voice sockets open through the ingress (frames both ways);
- a replica SIGKILLed mid-response closes the client's socket with 1014 naming it (last: it kills
  a replica of the module's cluster).

Slow (Ray and two engines: over a minute on the loaded 2-core machine)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))
sys.path.insert(0, str(Path(__file__).parent))

from ray_fleet_helpers import local_fleet  # noqa: E402
from serve_helpers import write_tokenizer  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from ws_helpers import TIMEOUT, lm_ws, normalized, play, recv_json  # noqa: E402

from execstate import LLM  # noqa: E402
from execstate.engine.sampling_params import SamplingParams  # noqa: E402
from execstate.model.random_models import make_random  # noqa: E402

pytestmark = pytest.mark.slow
NAME = "tiny-moe"
BS = 4
HEADER = "x-execstate-replica"
GREEDY = {"temperature": 0, "ignore_eos": True}


def run(coro: Any, timeout: float = 180) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = make_random("qwen3_moe", tmp_path_factory.mktemp("fleet_ws_moe"), seed=0)
    write_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), enable_return_routed_experts=True, seed=0, block_size=BS)


@pytest.fixture(scope="module")
def fleet(model_dir):
    from execstate.fleet.ray_app.app import fleet_app

    kwargs = {"enable_return_routed_experts": True, "seed": 0, "block_size": BS}
    with local_fleet(lambda: fleet_app(str(model_dir), 2, NAME, kwargs, replica_cpus=0.5, realtime_grace_s=60.0),
                     2, 90) as url:
        yield url


def replicas(url: str) -> dict[str, dict[str, Any]]:
    return {r["replica_id"]: r for r in httpx.get(url + "/v1/fleet/replicas", timeout=30).json()["replicas"]}


def test_lm_frames_through_the_ingress_equal_a_direct_connection(fleet, offline):
    one = next(iter(replicas(fleet).values()))
    direct = run(play(lm_ws(one["url"]), "direct"))
    through = [run(play(lm_ws(fleet), f"through-{i}")) for i in range(3)]
    kinds = [e["type"] for e in direct]
    assert kinds.count("response.delta") >= 2 and kinds[-1] == "session.closed" and "error" in kinds
    for events in through:
        assert [normalized(e) for e in events] == [normalized(e) for e in direct]
    done = [e["response"] for e in through[0] if e["type"] == "response.done"]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    with offline.open_session(sampling_params=params) as s:
        first = s.step([5, 17, 42, 99, 250, 311, 7, 8, 9])
        s.submit_event(event_id=1, kind="input", data={"text": "hello there"})
        second = s.step(max_tokens=3)
    assert [d["token_ids"] for d in done] == [first.token_ids, second.token_ids]


def test_a_session_opened_over_http_is_attached_on_its_replica(fleet, offline):
    opened: dict[str, str] = {}  # replica -> a session it holds
    for _ in range(12):
        r = httpx.post(fleet + "/v1/sessions", json={"sampling": {**GREEDY, "max_tokens": 3}}, timeout=60)
        assert r.status_code == 200, r.text
        opened.setdefault(r.headers[HEADER], r.json()["session_id"])
        if len(opened) == 2:
            break
    assert len(opened) == 2, "12 sessions all opened on one replica"
    for home, sid in opened.items():
        first = httpx.post(f"{fleet}/v1/sessions/{sid}/step", json={"input": [11, 12, 13, 14, 15]}, timeout=60)
        assert first.status_code == 200 and first.headers[HEADER] == home, first.text
        ref = offline.open_session(sampling_params=SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
        assert first.json()["token_ids"] == ref.step([11, 12, 13, 14, 15]).token_ids

        async def attach(sid: str) -> list[int]:
            async with connect(lm_ws(fleet), max_size=None) as ws:
                await ws.send(json.dumps({"type": "session.resume", "session_id": sid}))
                resumed = await recv_json(ws)
                assert resumed["type"] == "session.resumed", resumed  # another replica: not_found
                assert resumed["session"]["step_index"] == 1
                await ws.send(json.dumps({"type": "response.create", "input": {"token_ids": [21, 22, 23]}}))
                while (event := await recv_json(ws))["type"] != "response.done":
                    pass
                return event["response"]["token_ids"]

        assert run(attach(sid)) == ref.step([21, 22, 23]).token_ids
        ref.close()


def test_a_websocket_session_is_recorded_for_its_http_calls(fleet):
    async def main() -> list[tuple[int, str]]:
        answers = []
        for i in range(6):
            async with connect(lm_ws(fleet)) as ws:
                await ws.send(json.dumps({"type": "session.create", "session": {"id": f"ws-rec-{i}"}}))
                assert (await recv_json(ws))["type"] == "session.created"
                # held by this socket: its replica answers session_in_use; any other, not_found
                r = await asyncio.to_thread(httpx.get, f"{fleet}/v1/sessions/ws-rec-{i}", timeout=60)
                answers.append((r.status_code, r.headers[HEADER]))
                await ws.send(json.dumps({"type": "session.close"}))
                assert (await recv_json(ws))["type"] == "session.closed"
            # closed over the socket (and forgotten by the ingress): its replica's record says closed, another's 404
            gone = await asyncio.to_thread(httpx.get, f"{fleet}/v1/sessions/ws-rec-{i}", timeout=60)
            assert gone.status_code == 404 or gone.json()["status"] == "closed", gone.text
        return answers

    answers = run(main())
    assert [status for status, _ in answers] == [409] * 6, answers  # unrecorded: 1 in 64 by chance


def test_a_reconnect_resumes_on_the_sessions_replica(fleet, offline):
    step = {"type": "response.create", "input": {"token_ids": [31, 32, 33, 34]}, "max_tokens": 3}

    async def respond(ws) -> list[int]:
        await ws.send(json.dumps(step))
        while (event := await recv_json(ws))["type"] != "response.done":
            pass
        return event["response"]["token_ids"]

    async def main() -> list[list[int]]:
        tokens = []
        for i in range(4):
            async with connect(lm_ws(fleet), max_size=None) as ws:
                await ws.send(json.dumps({"type": "session.create", "session": {"id": f"ws-re-{i}",
                                                                                 "sampling": GREEDY}}))
                assert (await recv_json(ws))["type"] == "session.created"
                tokens.append(await respond(ws))
            # dropped without session.close: the replica keeps it (grace 60 s); a new socket resumes it
            async with connect(lm_ws(fleet), max_size=None) as ws:
                await ws.send(json.dumps({"type": "session.resume", "session_id": f"ws-re-{i}"}))
                resumed = await recv_json(ws)
                assert resumed["type"] == "session.resumed", resumed  # another replica: not_found
                assert resumed["session"]["step_index"] == 1
                tokens.append(await respond(ws))
                await ws.send(json.dumps({"type": "session.close"}))
                assert (await recv_json(ws))["type"] == "session.closed"
        return tokens

    got = run(main())
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    with offline.open_session(sampling_params=params) as s:
        want = [s.step([31, 32, 33, 34]).token_ids, s.step([31, 32, 33, 34]).token_ids]
    assert got == want * 4


def test_the_agent_and_voice_sockets_open_through_the_ingress(fleet):
    async def main() -> None:
        async with connect(fleet.replace("http://", "ws://") + "/v1/realtime/agent", subprotocols=["realtime"]) as ws:
            assert ws.subprotocol == "realtime"
            await ws.send(json.dumps({"type": "session.create", "event_id": "open", "session": {
                "turn": {"end_of_turn_silence_s": 0.2, "resume_after_s": 0.2}, "max_response_tokens": 4}}))
            created = await recv_json(ws)
            assert (created["type"], created["event_id"]) == ("session.created", "open"), created
            await ws.send(json.dumps({"type": "input_text.append", "text": "hello there"}))
            while (event := await recv_json(ws))["type"] != "response.done":
                pass
            assert event["response"]["status"] == "completed", event
            await ws.send(json.dumps({"type": "session.close", "event_id": "z"}))
            while (event := await recv_json(ws))["type"] != "session.closed":
                pass
        async with connect(fleet.replace("http://", "ws://") + "/v1/voice/realtime") as ws:
            first = await recv_json(ws)  # the server speaks first
            assert first["type"] == "session.created", first
            await ws.send(json.dumps({"type": "bogus", "event_id": "b"}))
            assert (await recv_json(ws))["type"] == "error"

    run(main())


def test_a_replica_killed_mid_response_closes_the_socket_with_1014(fleet):
    async def main() -> tuple[ConnectionClosed, str, float]:
        async with connect(lm_ws(fleet), max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.create", "session": {"id": "doomed", "sampling": GREEDY}}))
            assert (await recv_json(ws))["type"] == "session.created"
            held = await asyncio.to_thread(httpx.get, f"{fleet}/v1/sessions/doomed", timeout=60)
            assert held.status_code == 409
            victim = held.headers[HEADER]
            await ws.send(json.dumps({"type": "response.create", "input": {"token_ids": [3, 4, 5]},
                                      "max_tokens": 3000}))
            while (await recv_json(ws))["type"] != "response.delta":
                pass
            os.kill(replicas(fleet)[victim]["pid"], signal.SIGKILL)
            t0 = time.monotonic()
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), TIMEOUT)
            except ConnectionClosed as e:
                return e, victim, time.monotonic() - t0
        raise AssertionError("the socket was not closed")

    closed, victim, took = run(main())
    assert closed.rcvd is not None and closed.rcvd.code == 1014, closed
    assert closed.rcvd.reason == f"the replica serving this connection failed: {victim}"[:123]
    assert took < 10.0, took
