""""/health stays under 50 ms p99 while the hostile cases run", measured.

An ``execstate serve`` process (a tiny random MoE LM with a chat template, ``--world``, an API key)
takes every hostile case of findings 6 and 7, one after another, while another process probes
``/health`` every 10 ms: the evil delegation rule ``(a+)+$`` on a 40-character turn (hours of
backtracking with Python's ``re``), patterns RE2 refuses, an over-long turn, a flood of
delegations beyond the agent's task limit, JSON 100k deep on the three sockets and the HTTP API,
``event_id`` 10**30 (HTTP and socket), hostile ``fps`` / ``num_frames``, and refused WebSocket
upgrades; the whole list ``ROUNDS`` times. Each case checks its own refusal; the test prints the probes' p50 / p99 /
max per case
and overall (the numbers docs/security.md quotes).

What it asserts is robust on a shared machine: every probe answered 200, every case got its
refusal, and no probe waited 2 s or more. A stall of the loop (the evil rule before RE2: ~7 s at
26 characters, forever at 40) is far beyond that; the scheduling hiccups of a loaded 2-core box
(a few hundred ms at worst) are far below. The 50 ms p99 itself is reported, not asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from bounds_server import Prober, error_code
from serve_helpers import free_port, write_tokenizer
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from execstate.model.random_models import make_random

KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DEEP = "[" * 100_000 + "]" * 100_000
WORST_S = 2.0
ROUNDS = 8  # every case this many times: some 500 probes while they run


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = make_random("qwen3_moe", tmp_path_factory.mktemp("hostile_moe"), seed=0)
    write_tokenizer(model_dir)
    port = free_port()
    log = tmp_path_factory.mktemp("hostile_log") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "execstate", "serve", str(model_dir), "--world", "--api-key", KEY, "--port",
             str(port), "--max-num-seqs", "8", "--num-kv-blocks", "256", "--world-threads", "1",
             "--agent-max-tasks", "3"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the server did not start"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    yield url, log
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:  # a server stuck in C code never runs its signal handler
        proc.kill()
        proc.wait(30)


def _ws(url: str, path: str, **kw):
    return connect(url.replace("http", "ws", 1) + path, additional_headers=AUTH, max_size=None, **kw)


async def _ask(ws, msg: str | dict, until: Callable[[dict], bool] | None = None, timeout: float = 60) -> dict:
    await ws.send(msg if isinstance(msg, str) else json.dumps(msg))

    async def read() -> dict:
        while True:
            frame = await ws.recv()
            if isinstance(frame, str):
                event = json.loads(frame)
                if until is None or until(event):
                    return event

    return await asyncio.wait_for(read(), timeout)


# -- the hostile cases (each returns how many hostile messages it sent) -------------------------------------
async def evil_rule(url: str) -> int:
    async with _ws(url, "/v1/realtime/agent") as ws:
        created = await _ask(
            ws,
            {
                "type": "session.create",
                "session": {
                    "turn": {"end_of_turn_silence_s": 0.05},
                    "delegation": {"rules": [{"pattern": "(a+)+$", "tool": "lookup"}]},
                },
            },
        )
        assert created["type"] == "session.created", created
        for _ in range(5):
            turn = await _ask(ws, {"type": "input_text.append", "text": "a" * 40 + "!"},
                              lambda e: e["type"] == "input.turn" and e["kind"] == "end_of_turn")
            assert turn["text"] == "a" * 40 + "!", turn
            await ws.send('{"type": "response.cancel"}')
        await _ask(ws, {"type": "session.close"}, lambda e: e["type"] == "session.closed")
    return 5


def _error(e: dict) -> bool:
    return e["type"] == "error"


async def re2_refusals(url: str) -> int:
    async with _ws(url, "/v1/realtime/agent") as ws:
        for pattern in [r"(a)\1", "(?=x)", "(?<=y)z", "a{1001}", "(" * 200] * 5:
            e = await _ask(ws, {"type": "session.create", "session": {"delegation": {"rules": [
                {"pattern": pattern, "tool": "lookup"}]}}}, _error)
            assert error_code(e) == "invalid", e
    return 25


async def long_turn(url: str) -> int:
    async with _ws(url, "/v1/realtime/agent") as ws:
        await _ask(ws, {"type": "session.create", "session": {"turn": {"end_of_turn_silence_s": 30}}})
        refused = 0
        for i in range(12):
            await ws.send(json.dumps({"type": "input_text.append", "event_id": i, "text": "word " * 800}))
        e = await _ask(ws, {"type": "session.close"}, lambda e: e["type"] in ("session.closed", "error"))
        while e["type"] == "error":
            refused += error_code(e) == "invalid"
            e = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert refused == 8, refused  # 4 x 4000 characters fit in 16384
    return 12


async def task_flood(url: str) -> int:
    """Client-tool delegations stay open (their tasks wait for the client): the 4th is refused."""
    async with _ws(url, "/v1/realtime/agent") as ws:
        await _ask(ws, {"type": "session.create", "session": {
            "turn": {"end_of_turn_silence_s": 0.05}, "max_response_tokens": 2, "client_tools": [{"name": "ask"}],
            "delegation": {"rules": [{"pattern": "(?P<q>ask .+)", "tool": "ask"}]}}})
        seen: dict[str, int] = {}
        for i in range(5):
            e = await _ask(ws, {"type": "input_text.append", "text": f"please ask {i} now."},
                           lambda e: e["type"] == "delegation.created" or error_code(e) == "too_many_tasks")
            key = "created" if e["type"] == "delegation.created" else error_code(e)
            seen[key] = seen.get(key, 0) + 1
            await ws.send('{"type": "response.cancel"}')
        assert seen == {"created": 3, "too_many_tasks": 2}, seen  # --agent-max-tasks 3
        await _ask(ws, {"type": "session.close", "cancel_tasks": True}, lambda e: e["type"] == "session.closed")
    return 5


async def deep_json_sockets(url: str) -> int:
    frames = {"/v1/realtime": f'{{"type": "event.submit", "event_id": 1, "kind": "input", "data": {DEEP}}}',
              "/v1/realtime/agent": f'{{"type": "session.update", "session": {{"sampling": {{"x": {DEEP}}}}}}}',
              # world messages are at most 64 KiB
              "/v1/realtime/video": '{"type": "session.ping", "x": %s}' % ("[" * 30_000 + "]" * 30_000)}
    for path, frame in frames.items():
        async with _ws(url, path) as ws:
            for _ in range(10):
                e = await _ask(ws, frame, _error)
                assert error_code(e) == "invalid_message", e
    return 30


async def deep_json_http(url: str) -> int:
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as c:
        for path in ["/v1/chat/completions", "/v1/completions", "/v1/sessions"] * 5:
            r = await c.post(path, content=f'{{"x": {DEEP}}}', headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_message", r.text
    return 15


async def big_event_ids(url: str) -> int:
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["session_id"]
        for eid in [10**30, 2**63, -1] * 3:
            r = await c.post(f"/v1/sessions/{sid}/events", json={"event_id": eid, "kind": "input",
                                                                  "data": {"token_ids": [1]}})
            assert r.status_code == 400, r.text
        await c.delete(f"/v1/sessions/{sid}")
    async with _ws(url, "/v1/realtime") as ws:
        for eid in [10**30, "x" * 200] * 3:
            assert error_code(await _ask(ws, {"type": "session.get", "event_id": eid}, _error)) == "invalid_message"
    return 15


async def world_rates(url: str) -> int:
    async with _ws(url, "/v1/realtime/video") as ws:
        for fields in [{"fps": 5e-324}, {"fps": 1e300}, {"fps": 0.5}, {"fps": 0, "num_frames": 10**30}] * 3:
            e = await _ask(ws, {"type": "session.create", **fields}, lambda e: e["type"] in ("error", "video.start"))
            assert error_code(e) == "invalid_message", e
    return 12


async def refused_upgrades(url: str) -> int:
    for i in range(20):
        try:
            async with connect(url.replace("http", "ws", 1) + ["/v1/realtime", "/v1/realtime/agent"][i % 2]):
                raise AssertionError("accepted without the key")
        except InvalidStatus as e:
            assert e.response.status_code == 401
    return 20


CASES: list[tuple[str, Callable[[str], Awaitable[int]]]] = [
    ("evil rule, 40-char turn", evil_rule), ("patterns RE2 refuses", re2_refusals), ("over-long turn", long_turn),
    ("delegations beyond max_tasks", task_flood), ("JSON 100k deep, 3 sockets", deep_json_sockets),
    ("JSON 100k deep, HTTP", deep_json_http), ("event_id 10**30", big_event_ids),
    ("fps / num_frames", world_rates), ("refused upgrades", refused_upgrades),
]


def _p(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def test_health_while_every_hostile_case_runs(server):
    url, log = server
    rows = []
    with Prober(url) as probe:
        time.sleep(1.0)  # a baseline before the first case
        base_end = time.time()
        for _ in range(ROUNDS):
            for name, case in CASES:
                t0 = time.time()
                sent = asyncio.run(case(url))
                rows.append((name, sent, t0, time.time()))
        time.sleep(0.5)
    assert probe.statuses == {200}
    lines = [f"{'case':<32} {'msgs':>5} {'s':>6} {'probes':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}"]
    baseline = probe.window(0, base_end)
    lines.append(f"{'(baseline, idle)':<32} {'':>5} {'':>6} {len(baseline):>6} {_p(baseline, .5) * 1e3:>7.1f} "
                 f"{_p(baseline, .99) * 1e3:>7.1f} {max(baseline) * 1e3:>7.1f}")
    during: list[float] = []
    for name, _ in CASES:
        mine = [r for r in rows if r[0] == name]
        lat = [x for _, _, t0, t1 in mine for x in probe.window(t0, t1)]
        during += lat
        lines.append(f"{name:<32} {sum(r[1] for r in mine):>5} {sum(r[3] - r[2] for r in mine):>6.1f} {len(lat):>6} "
                     f"{_p(lat, .5) * 1e3:>7.1f} {_p(lat, .99) * 1e3:>7.1f} {max(lat, default=0) * 1e3:>7.1f}")
    lines.append(f"{'all hostile cases':<32} {sum(r[1] for r in rows):>5} {sum(r[3] - r[2] for r in rows):>6.1f} "
                 f"{len(during):>6} {statistics.median(during) * 1e3:>7.1f} {_p(during, .99) * 1e3:>7.1f} "
                 f"{max(during) * 1e3:>7.1f}")
    print("\n/health while the hostile bounds cases run; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n" + "\n".join(lines))
    text = Path(log).read_text()
    assert "Traceback" not in text and "RecursionError" not in text and "ERROR" not in text, text[-3000:]
    assert max(during) < WORST_S, "\n".join(lines)
