"""The client side of ``execstate bench cluster``: runs a :class:`ClusterWorkload` against the
fleet's ingress and records one :class:`Turn` per request.

``concurrency`` workers take users in order; each user runs its turns one after the other
(a completion user streams ``/v1/completions`` with its whole conversation, a session user steps
its session). A request that fails is recorded with its error (a stream cut mid-way included:
the ingress ends it with an SSE ``error`` event) and the user goes on with its next turn; the
conversation keeps only answers that completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx

from execstate_bench.cluster_workload import ClusterWorkload, Turn

REPLICA_HEADER = "x-execstate-replica"


async def run_workload(url: str, model: str, w: ClusterWorkload, t0: float | None = None,
                       turns: list[Turn] | None = None) -> list[Turn]:
    """Every turn of every user (module docstring); ``t0``: the run's time origin; ``turns``: a
    list the finished turns are appended to as they finish (progress, for a fault injector)."""
    origin = time.perf_counter() if t0 is None else t0
    users: asyncio.Queue[int] = asyncio.Queue()
    for u in range(w.users):
        users.put_nowait(u)
    turns = [] if turns is None else turns
    limits = httpx.Limits(max_connections=w.concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def worker() -> None:
            while not users.empty():
                u = users.get_nowait()
                run = _session_user if w.is_session(u) else _completion_user
                await run(client, model, w, u, origin, turns)

        await asyncio.gather(*(worker() for _ in range(w.concurrency)))
    return sorted(turns, key=lambda t: t.start)


async def _completion_user(client: httpx.AsyncClient, model: str, w: ClusterWorkload, u: int,
                           origin: float, out: list[Turn]) -> None:
    history = w.system_prompt(w.system_of(u))
    for k in range(w.turns):
        prompt = history + w.user_turn(u, k)
        t = Turn(u, k, "completion", time.perf_counter() - origin)
        body = {"model": model, "prompt": prompt, "max_tokens": w.reply_len, "temperature": 0, "ignore_eos": True,
                "stream": True, "return_token_ids": True}
        reply: list[int] = []
        try:
            async with client.stream("POST", "/v1/completions", json=body, headers=w.headers(u)) as r:
                t.replica = r.headers.get(REPLICA_HEADER)
                if r.status_code != 200:
                    t.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                else:
                    done = await _read_sse(r, t, reply, origin)
                    if not done and t.error is None:
                        t.error = "the stream ended without [DONE]"
        except httpx.HTTPError as e:
            t.error = f"{type(e).__name__}: {e}"
        t.latency = time.perf_counter() - origin - t.start
        t.tokens = len(reply)
        out.append(t)
        if t.error is None:
            history = prompt + reply


async def _read_sse(r: httpx.Response, t: Turn, reply: list[int], origin: float) -> bool:
    async for line in r.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return True
        data: dict[str, Any] = json.loads(line[6:])
        if "error" in data:
            t.error = str(data["error"].get("message", data["error"]))
            return False
        for c in data.get("choices", []):
            ids = c.get("token_ids") or []
            if ids and t.ttft is None:
                t.ttft = time.perf_counter() - origin - t.start
            reply.extend(ids)
    return False


async def _session_user(client: httpx.AsyncClient, model: str, w: ClusterWorkload, u: int,
                        origin: float, out: list[Turn]) -> None:
    del model
    sampling = {"temperature": 0, "max_tokens": w.reply_len, "ignore_eos": True}
    t = Turn(u, 0, "session", time.perf_counter() - origin)
    try:
        opened = await client.post("/v1/sessions", json={"sampling": sampling}, headers=w.headers(u))
        opened.raise_for_status()
    except httpx.HTTPError as e:
        t.error = f"open: {type(e).__name__}: {e}"
        out.append(t)
        return
    sid = opened.json()["session_id"]
    for k in range(w.turns):
        step = (w.system_prompt(w.system_of(u)) if k == 0 else []) + w.user_turn(u, k)
        t = t if k == 0 else Turn(u, k, "session", time.perf_counter() - origin)
        try:
            r = await client.post(f"/v1/sessions/{sid}/step", json={"input": step}, headers=w.headers(u))
            t.replica = r.headers.get(REPLICA_HEADER)
            if r.status_code == 200:
                t.tokens = len(r.json().get("token_ids") or [])
            else:
                t.error = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            t.error = f"{type(e).__name__}: {e}"
        t.latency = t.ttft = time.perf_counter() - origin - t.start  # a step answers whole
        out.append(t)
    with contextlib.suppress(httpx.HTTPError):
        await client.delete(f"/v1/sessions/{sid}", headers=w.headers(u))
