"""``execstate bench soak --minutes N``: a server kept busy on every surface, with faults, for N minutes.

One ``execstate serve`` process (its own, like an operator's): a random MoE with 2048 positions and
the tests' tokenizer, route return on, the shipped world model, two tenants' API keys and a
session quota, the offload tiers (DRAM, disk on a small tmpfs when it can mount one, a
``redis-server`` of its own). Against it, ``clients`` concurrent client loops, each picking its next
operation by weight from every surface: completions (plain, streamed, cut, slow readers), chat
streamed, tools, structured outputs, echo with logprobs, HTTP sessions, ``/v1/realtime`` sessions
with checkpoints and forks, agents, voice with synthesised speech, world sessions
(``soak_clients.py``, ``soak_sockets.py``). The faults of ``soak_faults.py`` on a fixed schedule.

Every ``period`` seconds (``soak_record.py``): the server's RSS, open fds, threads, KV blocks in use,
requests running and waiting, tier units, sessions and agents, and each surface's p50/p99 and
outcomes in the window. At the end the clients stop, every session they opened is closed, the
engine is let go idle, and the blocks still in use are leaked ones. The report (JSON) holds the
samples, the fault windows, the totals per surface and outcome, the verdict (``soak_record.verdict``)
and the machine's load; ``--png`` plots it over time (``soak_plot.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from execstate_bench import soak_clients as hc
from execstate_bench import soak_sockets as ws
from execstate_bench.machine import cpu_name, loadavg
from execstate_bench.pd_cluster import Cluster
from execstate_bench.redis_server import RedisServer, redis_server_available
from execstate_bench.soak_faults import Faults, mount_small_tmpfs, run_faults, unmount
from execstate_bench.soak_record import Sample, Tally, parse_metrics, proc_stats, verdict, window_stats

KEYS = ("soak-key-tenant-a-0001", "soak-key-tenant-b-0002")
DISK_TIER_MIB = 16  # the disk tier's capacity: half its tmpfs, which is full only while the fault fills it
# Warm-up (the verdict's flat checks start after it): the server's memories bounded by a count fill
# first. At this mix (4 clients) the offload tiers are full after 2-3 minutes and the LM sessions'
# ended-session memory (the last 1024 per kind, kept for their refusals) after 7-9 minutes (measured
# in the 60-minute runs); 10 minutes covers both. A world session's memory fills only after about
# 35 minutes, but an ended world session holds no tensors, so filling it moves RSS little.
WARMUP_S = 600.0
WEIGHTS = {"completion": 3, "completion_sse": 3, "chat_sse": 2, "tools": 1, "structured": 1, "echo": 1,
           "http_session": 2, "realtime": 2, "agent": 1, "voice": 1, "world": 1}


def log_problems(log: str, most: int = 8) -> list[str]:
    """The server log's problems: each traceback (whole) and ERROR/CRITICAL line, then each WARNING
    line (faults make many), at most ``most`` of them, each kind in the log's order."""
    errors: list[str] = []
    warnings: list[str] = []
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Traceback"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
                j += 1
            errors.append("\n".join(lines[i:j + 1]))
            i = j + 1
            continue
        if any(f" {level} " in line for level in ("ERROR", "CRITICAL")):
            errors.append(line)
        elif " WARNING " in line:
            warnings.append(line)
        i += 1
    return (errors + warnings)[:most]


def build_model(directory: Path) -> Path:
    from execstate.model.random_models import make_random
    from execstate.model.random_tokenizer import write_tokenizer

    d = make_random("qwen3_moe", directory, seed=0, max_position_embeddings=2048)
    write_tokenizer(d)
    return d


def server_args(model: Path, keys_file: Path, disk: Path, redis: RedisServer | None) -> list[str]:
    args = ["serve", str(model), "--served-model-name", hc.NAME, "--enable-return-routed-experts",
            "--world", "world", "--api-keys-file", str(keys_file), "--tenant-max-sessions", "24",
            "--session-idle-ttl", "30", "--max-num-seqs", "16", "--max-waiting-requests", "48",
            "--num-kv-blocks", "1024", "--offload-dram", "32MiB", "--offload-disk-dir", str(disk),
            "--offload-disk-bytes", f"{DISK_TIER_MIB}MiB", "--offload-timeout", "0.5"]
    if redis is not None:
        args += ["--offload-redis-url", redis.url, "--offload-redis-bytes", "32MiB"]
    return args


async def _client(s: hc.Soak, seed: int, stop: asyncio.Event, audio: bytes, weights: dict[str, int]) -> None:
    rng = random.Random(seed)
    ops = {"completion": hc.completion, "completion_sse": hc.completion_sse, "chat_sse": hc.chat_sse,
           "tools": hc.tools, "structured": hc.structured, "echo": hc.echo_scored, "http_session": hc.http_session,
           "realtime": ws.realtime, "agent": ws.agent, "world": ws.world}
    names, chances = list(weights), list(weights.values())
    while not stop.is_set():
        name = rng.choices(names, chances)[0]
        t = time.monotonic()
        try:
            if name == "voice":
                await ws.voice(s, rng, audio)
            else:
                await ops[name](s, rng)
        except httpx.HTTPError as e:  # the connection itself failed: recorded, the loop goes on
            s.record(name, t, f"http:{type(e).__name__}")
        await asyncio.sleep(rng.uniform(0.05, 0.3))


async def _sampler(s: hc.Soak, pid: int, period: float, samples: list[Sample], stop: asyncio.Event,
                   max_rss_mb: float, sample: Callable[..., Awaitable[Sample]] | None = None) -> None:
    """A sample every ``period`` (``sample``: default one server's, ``_sample``); past ``max_rss_mb``
    the soak stops early (a shared machine's memory)."""
    last = s.now()
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
        now = s.now()
        samples.append(await (sample or _sample)(s, pid, s.tally.between(last, now), now))
        last = now
        if samples[-1].rss_mb > max_rss_mb:
            s.stopped_early = f"the server's RSS passed {max_rss_mb:g} MB at {now:.0f} s"
            stop.set()


async def _sample(s: hc.Soak, pid: int, ops: list[Any], now: float) -> Sample:
    rss, fds, threads = proc_stats(pid)
    try:
        r = await s.http.get(s.url + "/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=10)
        m = parse_metrics(r.text)
    except httpx.HTTPError:
        m = {}

    def one(name: str) -> float:
        return m.get(name, {}).get("", float("nan"))

    def by_label(name: str, label: str) -> dict[str, float]:
        return {k.split("=", 1)[1]: v for k, v in m.get(name, {}).items() if k.startswith(label + "=")}

    sessions = {kind: sum(m.get(f"execstate_tenant_{kind}", {}).values())
                for kind in ("sessions", "agents", "world_sessions", "hibernated_sessions", "checkpoints")}
    p50, p99, outcomes = window_stats(ops)
    return Sample(round(now, 1), rss, fds, threads, one("execstate_kv_blocks_used"),
                  one("execstate_num_requests_running"), one("execstate_num_requests_waiting"),
                  by_label("execstate_offload_tier_units", "tier"), sessions, p50, p99, outcomes)


async def _drain(s: hc.Soak, timeout_s: float = 90.0) -> float:
    """Close what the clients left open and wait until nothing runs; the KV blocks still in use."""
    await hc.close_leftovers(s)
    deadline = time.monotonic() + timeout_s
    used = float("nan")
    while time.monotonic() < deadline:
        r = await s.http.get(s.url + "/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=10)
        m = parse_metrics(r.text)
        busy = m.get("execstate_num_requests_running", {}).get("", 0) + m.get(
            "execstate_num_requests_waiting", {}).get("", 0)
        used = m.get("execstate_kv_blocks_used", {}).get("", float("nan"))
        if busy == 0 and used == 0:
            break
        await asyncio.sleep(1.0)
    return used


async def _soak(url: str, pid: int, minutes: float, clients: int, period: float, faults: Faults,
                audio: bytes, weights: dict[str, int], max_rss_mb: float) -> dict[str, Any]:
    duration = minutes * 60
    stop = asyncio.Event()
    tally, samples = Tally(), list[Sample]()
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        s = hc.Soak(url, KEYS, tally, time.monotonic(), http)
        tasks = [asyncio.create_task(_client(s, i, stop, audio, weights)) for i in range(clients)]
        tasks.append(asyncio.create_task(_sampler(s, pid, period, samples, stop, max_rss_mb)))
        fault_task = asyncio.create_task(run_faults(s, faults, duration, stop))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), duration)
        stop.set()
        await asyncio.wait(tasks + [fault_task], timeout=120)
        for t in tasks + [fault_task]:
            t.cancel()
        await asyncio.gather(*tasks, fault_task, return_exceptions=True)
        end = s.now()
        leaked = await _drain(s)
    warmup = min(0.2 * duration, WARMUP_S)
    totals: dict[str, int] = {}
    for o in tally.ops:
        totals[f"{o.surface}:{o.outcome}"] = totals.get(f"{o.surface}:{o.outcome}", 0) + 1
    return {"minutes": minutes, "clients": clients, "surfaces": sorted(weights), "warmup_s": warmup,
            "stopped_early": s.stopped_early, "operations": len(tally.ops),
            "totals": dict(sorted(totals.items())), "faults": faults.windows,
            "samples": [vars(x) for x in samples],
            "verdict": verdict(samples, tally, warmup, end, leaked, injected=[])}


def run_soak(minutes: float = 2.0, clients: int = 5, period: float | None = None, threads: int = 2,
             skip: tuple[str, ...] = (), max_rss_mb: float = 6000.0) -> dict[str, Any]:
    """The soak (module docstring); its report. ``skip``: operations of ``WEIGHTS`` left out (to tell
    which surface a trend comes from)."""
    unknown = sorted(set(skip) - set(WEIGHTS))
    if unknown:
        raise ValueError(f"unknown soak operation(s) {unknown}; known: {sorted(WEIGHTS)}")
    weights = {k: v for k, v in WEIGHTS.items() if k not in skip}
    work = Path(tempfile.mkdtemp(prefix="execstate-soak-"))
    cluster = Cluster(threads=threads)
    redis = RedisServer(work / "redis").start() if redis_server_available() else None
    disk = work / "disk"
    mounted, how = mount_small_tmpfs(disk, f"{2 * DISK_TIER_MIB}m")
    load_before = loadavg()
    try:
        model = build_model(work / "model")
        keys_file = work / "keys"
        keys_file.write_text(f"{KEYS[0]} tenant-a\n{KEYS[1]} tenant-b\n")
        url = cluster.spawn("server", server_args(model, keys_file, disk, redis), threads)
        with httpx.Client() as c:
            cluster.wait_healthy(c)
        audio = ws.speech()
        faults = Faults(redis, disk, mounted)
        report = asyncio.run(_soak(url, cluster.procs["server"].popen.pid, minutes, clients,
                                   period or max(2.0, minutes * 60 / 120), faults, audio, weights, max_rss_mb))
        report["server_problems"] = log_problems(cluster.procs["server"].log.read_text(errors="replace"))
    finally:
        cluster.close()
        if redis is not None:
            redis.kill()
        if mounted:
            unmount(disk)
    report.update(cpu=cpu_name(), loadavg_before=load_before, loadavg_after=loadavg(),
                  disk_tier=(f"a {2 * DISK_TIER_MIB} MiB tmpfs" if mounted else f"the ordinary filesystem ({how})"),
                  redis=redis is not None)
    return report
