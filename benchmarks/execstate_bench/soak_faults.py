"""The soak's injected faults, each a window on the run's timeline (start, end, what).

The schedule (fractions of the run, so a 2-minute and a 60-minute soak see every fault once):

==========  =======================================================================================
0.15        Redis paused (SIGSTOP) for ``pause_s``, then SIGCONT: the shared tier hangs; reloads
            time out (``--offload-timeout``) and the prompts are recomputed
0.30        Redis full: ``maxmemory`` set far below what it holds, ``noeviction``: writes fail
0.45        Redis stopped (killed), restarted empty on the same port after ``down_s``
0.60        the disk tier's filesystem full: a filler file takes the last byte of its tmpfs (twice
            the tier's capacity, so full only then; needs root and ``mount``; otherwise recorded as
            skipped, with why)
0.75        a burst past every limit (``bursts``): bodies beyond ``--max-request-bytes`` (413),
            ``n`` beyond ``--max-n``, a flood past the waiting queue (429), a 3.9 MB ``/tokenize``,
            sessions past the tenant quota, requests without a key (401), a malformed WebSocket
==========  =======================================================================================

Clients cut mid-stream and slow readers run all along (``soak_clients.py``). None of these may
cause a 5xx: every tier failure fails closed (recompute), every bound answers 4xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from execstate_bench.redis_server import RedisServer
from execstate_bench.soak_clients import NAME, Soak

PAUSE_S, FULL_S, DOWN_S, DISK_FULL_S = 6.0, 15.0, 10.0, 15.0


@dataclass
class Faults:
    redis: RedisServer | None
    disk_dir: Path | None
    disk_mounted: bool
    windows: list[dict[str, Any]] = field(default_factory=list)  # {"fault", "start", "end", "note"}

    def window(self, name: str, start: float, end: float, note: str = "") -> None:
        self.windows.append({"fault": name, "start": round(start, 1), "end": round(end, 1), "note": note})


def mount_small_tmpfs(directory: Path, size: str) -> tuple[bool, str]:
    """A tmpfs of ``size`` at ``directory`` (the disk tier's home), or why not."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False, "not root: no filesystem to fill (the disk tier runs on the ordinary filesystem)"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                       capture_output=True, text=True)
    return (r.returncode == 0, r.stderr.strip()[:200] or "mounted")


def unmount(directory: Path) -> None:
    subprocess.run(["umount", str(directory)], capture_output=True)


async def run_faults(s: Soak, f: Faults, duration_s: float, stop: asyncio.Event,
                     plan: list[tuple[float, Callable[[Any, Faults], Awaitable[None]]]] | None = None) -> None:
    """The faults of ``plan`` (default: the table above), each at its fraction of the run, in turn."""
    plan = plan or [(0.15, redis_pause), (0.30, redis_full), (0.45, redis_down), (0.60, disk_full), (0.75, bursts)]
    for at, fault in plan:
        delay = at * duration_s - s.now()
        if delay > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            return
        await fault(s, f)


async def redis_pause(s: Soak, f: Faults) -> None:
    if f.redis is None or f.redis.proc is None:
        return f.window("redis_paused", s.now(), s.now(), "skipped: no redis-server")
    t0 = s.now()
    os.kill(f.redis.proc.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(PAUSE_S)
    finally:
        os.kill(f.redis.proc.pid, signal.SIGCONT)
    f.window("redis_paused", t0, s.now())


async def redis_full(s: Soak, f: Faults) -> None:
    if f.redis is None or f.redis.proc is None:
        return f.window("redis_full", s.now(), s.now(), "skipped: no redis-server")
    t0 = s.now()
    client = f.redis.client()
    try:
        before = client.config_get("maxmemory")["maxmemory"]
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1mb")
        await asyncio.sleep(FULL_S)
        client.config_set("maxmemory", before)
    finally:
        client.close()
    f.window("redis_full", t0, s.now())


async def redis_down(s: Soak, f: Faults) -> None:
    if f.redis is None:
        return f.window("redis_stopped", s.now(), s.now(), "skipped: no redis-server")
    t0 = s.now()
    f.redis.kill()
    await asyncio.sleep(DOWN_S)
    await asyncio.to_thread(f.redis.start)
    f.window("redis_stopped", t0, s.now(), "killed, then restarted empty on its port")


async def disk_full(s: Soak, f: Faults) -> None:
    if f.disk_dir is None or not f.disk_mounted:
        return f.window("disk_full", s.now(), s.now(), "skipped: the disk tier is not on a tmpfs (needs root)")
    t0 = s.now()
    filler = f.disk_dir / "soak-filler"
    with contextlib.suppress(OSError), open(filler, "wb") as fh:
        chunk = b"\0" * (1 << 16)
        while True:
            fh.write(chunk)  # until ENOSPC: the filesystem is full
    await asyncio.sleep(DISK_FULL_S)
    filler.unlink(missing_ok=True)
    f.window("disk_full", t0, s.now(), "ENOSPC for every write of the disk tier")


async def bursts(s: Soak, f: Faults) -> None:
    """Past every limit at once; each answer must be a 4xx (recorded under ``burst``)."""
    t0 = s.now()
    key = {"Authorization": f"Bearer {s.keys[0]}"}
    big = {"model": NAME, "prompt": "x" * (5 << 20)}
    calls = [("POST", "/v1/completions", big, key), ("POST", "/tokenize", {"prompt": "tokens " * 560_000}, key),
             ("POST", "/v1/completions", {"model": NAME, "prompt": [5], "n": 10_000}, key),
             ("POST", "/v1/completions", {"model": NAME, "prompt": [5], "max_tokens": 1}, {}),
             ("GET", "/metrics", None, {})]
    calls += [("POST", "/v1/completions", {"model": NAME, "prompt": [7, 8, 9], "max_tokens": 32}, key)] * 300
    calls += [("POST", "/v1/sessions", {"session_id": f"burst-{i}"}, key) for i in range(40)]

    async def one(method: str, path: str, body: Any, headers: dict[str, str]) -> None:
        t = time.monotonic()
        try:
            r = await s.http.request(method, s.url + path, json=body, headers=headers)
            s.record("burst", t, r.status_code)
            if path == "/v1/sessions" and r.status_code == 200:
                s.open_sessions[body["session_id"]] = headers["Authorization"]
        except httpx.HTTPError as e:
            s.record("burst", t, f"http:{type(e).__name__}")

    await asyncio.gather(*(one(*c) for c in calls))
    await malformed_socket(s)
    f.window("burst", t0, s.now(), f"{len(calls)} requests past the limits, 1 malformed WebSocket")


async def malformed_socket(s: Soak) -> None:
    from websockets.asyncio.client import connect

    t = time.monotonic()
    try:
        async with connect(s.url.replace("http://", "ws://", 1) + "/v1/realtime",
                           additional_headers={"Authorization": f"Bearer {s.keys[1]}"}) as ws:
            await ws.send("{" * 100_000)  # nested past the JSON depth bound
            answer = await asyncio.wait_for(ws.recv(), 30)
            code = __import__("json").loads(answer).get("error", {}).get("type", "?")
    except Exception as e:
        code = f"ws:{type(e).__name__}"
    s.record("burst", t, code)
