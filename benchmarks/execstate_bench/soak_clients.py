"""The soak's HTTP clients: one operation of each surface, as a careful or careless user does it.

Each ``async def`` runs one operation against the server and records it in the tally
(``soak_record.Tally``): completions (plain, streamed, streamed and cut mid-stream, streamed by a
slow reader), chat streamed, chat with a forced tool call, a structured output, echo with logprobs
(a prompt scored through the scheduler), and an HTTP session (open, an event, steps, close). Every
call names one of the two tenants' keys. The WebSocket surfaces are in ``soak_sockets.py``.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from execstate_bench.soak_record import Tally

NAME = "soak"
TOOL = {"type": "function", "function": {"name": "lookup", "description": "look a word up",
                                         "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                                                        "required": ["word"]}}}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"]}


@dataclass
class Soak:
    """What every client shares: the server, the two tenants' keys, the tally and the sessions opened
    over HTTP and not closed yet (closed at the end: none may be left holding blocks)."""

    url: str
    keys: tuple[str, str]
    tally: Tally
    t0: float
    http: httpx.AsyncClient
    open_sessions: dict[str, str] = field(default_factory=dict)  # session id -> key
    stopped_early: str | None = None  # why the soak ended before its time (the sampler's RSS guard)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def auth(self, rng: random.Random) -> dict[str, str]:
        return {"Authorization": f"Bearer {rng.choice(self.keys)}"}

    def record(self, surface: str, started: float, outcome: str | int) -> None:
        self.tally.add(self.now(), surface, time.monotonic() - started, outcome)


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


async def completion(s: Soak, rng: random.Random) -> None:
    t = time.monotonic()
    body = {"model": NAME, "prompt": ids(rng, rng.randrange(4, 64)), "max_tokens": rng.randrange(1, 24),
            "temperature": 0.7, "seed": rng.randrange(1000)}
    r = await s.http.post(s.url + "/v1/completions", json=body, headers=s.auth(rng))
    s.record("completions", t, r.status_code)


async def _sse(s: Soak, rng: random.Random, surface: str, path: str, body: dict[str, Any],
               cut_after: int | None = None, read_delay_s: float = 0.0) -> None:
    """A streamed request read to ``[DONE]``; ``cut_after`` chunks then the client leaves (a cut);
    ``read_delay_s`` between chunks (a slow reader)."""
    t = time.monotonic()
    outcome: str | int = "ok"
    async with s.http.stream("POST", s.url + path, json={**body, "stream": True}, headers=s.auth(rng)) as r:
        if r.status_code != 200:
            await r.aread()
            s.record(surface, t, r.status_code)
            return
        n = 0
        async for line in r.aiter_lines():
            if line.startswith('data: {"error"'):
                outcome = json.loads(line[6:])["error"].get("type") or "stream_error"
                break
            if line.startswith("data: {"):
                n += 1
                if cut_after is not None and n >= cut_after:
                    outcome = "cut"
                    break
                if read_delay_s:
                    import asyncio

                    await asyncio.sleep(read_delay_s)
    s.record(surface, t, outcome)


async def completion_sse(s: Soak, rng: random.Random) -> None:
    body = {"model": NAME, "prompt": ids(rng, rng.randrange(4, 48)), "max_tokens": rng.randrange(8, 48),
            "ignore_eos": True, "return_token_ids": True}
    roll = rng.random()
    if roll < 0.15:
        await _sse(s, rng, "completions_cut", "/v1/completions", body, cut_after=rng.randrange(1, 6))
    elif roll < 0.25:
        await _sse(s, rng, "completions_slow_reader", "/v1/completions", body, read_delay_s=0.1)
    else:
        await _sse(s, rng, "completions_sse", "/v1/completions", body)


async def chat_sse(s: Soak, rng: random.Random) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"hello {rng.randrange(99)}"}]
    await _sse(s, rng, "chat_sse", "/v1/chat/completions", {"model": NAME, "messages": msgs,
                                                             "max_tokens": rng.randrange(4, 32)})


async def tools(s: Soak, rng: random.Random) -> None:
    t = time.monotonic()
    body = {"model": NAME, "messages": [{"role": "user", "content": "look up soak"}], "tools": [TOOL],
            "tool_choice": "required", "max_tokens": 48, "temperature": 0}
    r = await s.http.post(s.url + "/v1/chat/completions", json=body, headers=s.auth(rng))
    s.record("tools", t, r.status_code)


async def structured(s: Soak, rng: random.Random) -> None:
    t = time.monotonic()
    body = {"model": NAME, "prompt": ids(rng, 8), "max_tokens": 40, "temperature": 0.5, "seed": rng.randrange(99),
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}}
    r = await s.http.post(s.url + "/v1/completions", json=body, headers=s.auth(rng))
    s.record("structured", t, r.status_code)


async def echo_scored(s: Soak, rng: random.Random) -> None:
    t = time.monotonic()
    body = {"model": NAME, "prompt": ids(rng, rng.randrange(64, 400)), "echo": True, "logprobs": 5,
            "max_tokens": 0}
    r = await s.http.post(s.url + "/v1/completions", json=body, headers=s.auth(rng))
    s.record("echo_logprobs", t, r.status_code)


async def http_session(s: Soak, rng: random.Random) -> None:
    t = time.monotonic()
    sid = f"h{rng.randrange(10**9)}"
    auth = s.auth(rng)
    r = await s.http.post(s.url + "/v1/sessions", json={"session_id": sid, "sampling": {"max_tokens": 6}},
                          headers=auth)
    if r.status_code != 200:
        s.record("sessions_http", t, r.status_code)
        return
    s.open_sessions[sid] = auth["Authorization"]
    status = 200
    for i in range(rng.randrange(1, 4)):
        if i == 1:
            e = await s.http.post(s.url + f"/v1/sessions/{sid}/events", headers=auth,
                                  json={"event_id": 1, "kind": "input", "data": {"token_ids": ids(rng, 3)}})
            status = max(status, e.status_code)
        r = await s.http.post(s.url + f"/v1/sessions/{sid}/step", json={"input": ids(rng, 6)}, headers=auth)
        status = max(status, r.status_code)
    if rng.random() < 0.8:  # the rest are left to expire (--session-idle-ttl) or to the end's sweep
        r = await s.http.delete(s.url + f"/v1/sessions/{sid}", headers=auth)
        s.open_sessions.pop(sid, None)
        status = max(status, r.status_code)
    s.record("sessions_http", t, status)


async def close_leftovers(s: Soak) -> None:
    """Close the HTTP sessions the clients left open (404/410: expired already)."""
    for sid, auth in list(s.open_sessions.items()):
        await s.http.delete(s.url + f"/v1/sessions/{sid}", headers={"Authorization": auth})
        s.open_sessions.pop(sid, None)
