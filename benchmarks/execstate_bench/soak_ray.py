"""``execstate bench soak --ray``: the soak against a Ray Serve fleet (``execstate serve MODEL --ray``).

The fleet is ``execstate serve MODEL --ray --replicas N`` in its own process (its own local Ray
cluster, loopback only), serving the soak's random MoE with the two tenants' keys (sessions left
open expire after 30 s, ``--session-idle-ttl``, as on the single server) and a
``redis-server`` of its own as every replica's shared tier (``--offload-redis-url``; each replica
copies its live sessions there every second, ``--session-copy-every``). Its replicas run
``OMP_NUM_THREADS = max(1, threads // N)`` kernel threads each.

Clients: the soak's loops (``soak.py``) over the surfaces a fleet replica serves (``WEIGHTS``
without world sessions: the world server is not a fleet replica), plus the resident sessions and
the version probe of ``soak_ray_faults.py``. Faults, as fractions of the run:

====  ===========================================================================================
0.10  Redis paused (SIGSTOP) for 6 s
0.18  Redis full (``maxmemory`` 1 MB, ``noeviction``) for 15 s
0.26  Redis stopped, restarted empty after 10 s
0.36  a replica SIGKILLed mid-load (the one holding the most resident sessions, with 4 long streams
      started just before), then Ray's replacement awaited
0.50  a rolling weight update to other weights of the same shapes (the version probe sending back
      to back from a second before to a second after)
0.58  the burst past every limit (``soak_faults.bursts``)
====  ===========================================================================================

The disk tier's fault is recorded as skipped: the CLI's fleet has no disk tier. Every fault
falls before the last third of the run, which the p99 trend compares with the first third after
warm-up: the trend then reads what the faults left behind, not the faults themselves (the first
third holds the Redis faults and, in a run of 10 minutes or less, the kill).

Every sample sums the fleet's processes (the CLI, Ray's, the ingress and the replicas: RSS, fds,
threads) and the replicas' ``/metrics``, each read from the replica's own server (KV blocks,
requests, tier units, sessions). At the end every session is closed and the replicas let go idle;
the blocks still in use on any replica are leaked ones.

Errors: an operation *failed* when it ended in a 5xx, a server error, a stream ended
``replica_failed``, a socket closed where an answer was due, or a transport error. A failed
operation is *injected* (the kill explains it) when it was in flight at the kill and either
touched the killed replica (``x-execstate-replica`` of any of its answers) or never learnt a
replica (a socket; a request that failed before its head); every other failure is *unexpected*.
The report's ``fleet`` section has the kill (time to resume of each resident session, steps lost,
sessions the ingress resumed, the replacement's registration), the update and the probe's answers
(wrong-version answers during and outside the update).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from execstate_bench import soak_clients as hc
from execstate_bench import soak_ray_faults as rf
from execstate_bench.machine import cpu_name, loadavg
from execstate_bench.pd_cluster import free_port
from execstate_bench.redis_server import RedisServer, redis_server_available
from execstate_bench.soak import KEYS, WEIGHTS, _client, _sampler, build_model, log_problems
from execstate_bench.soak_faults import Faults, bursts, redis_down, redis_full, redis_pause, run_faults
from execstate_bench.soak_record import Sample, Tally, is_server_error, parse_metrics, verdict, window_stats

RAY_WEIGHTS = {k: v for k, v in WEIGHTS.items() if k != "world"}
FAILED = ("replica_failed", "closed")  # besides 5xx and server errors: a stream cut, a socket lost


@dataclass
class FleetSoak(hc.Soak):
    """The soak's shared state, which also keeps the replicas each operation's answers named."""

    seen: dict[int, set[str]] = field(default_factory=dict)  # asyncio task -> replicas of its operation
    op_replicas: list[frozenset[str]] = field(default_factory=list)  # per operation of the tally

    def saw(self, replica: str) -> None:
        self.seen.setdefault(id(asyncio.current_task()), set()).add(replica)

    def record(self, surface: str, started: float, outcome: str | int) -> None:
        super().record(surface, started, outcome)
        self.op_replicas.append(frozenset(self.seen.pop(id(asyncio.current_task()), set())))


def failed(outcome: str) -> bool:
    return is_server_error(outcome) or outcome in FAILED or outcome.startswith(("http:", "connect:", "ws:"))


def classify(s: FleetSoak, kill: dict[str, Any] | None) -> dict[str, Any]:
    """Failed operations split into injected (explained by the kill) and unexpected (module docstring)."""
    injected, unexpected, in_flight = list[dict[str, Any]](), list[dict[str, Any]](), 0
    t_kill, victim = (kill["t_kill"], kill["victim"]) if kill else (None, None)
    for op, reps in zip(s.tally.ops, s.op_replicas, strict=True):
        during = t_kill is not None and op.t - op.seconds <= t_kill <= op.t
        in_flight += during
        if not failed(op.outcome):
            continue
        row = {"t": round(op.t, 2), "surface": op.surface, "outcome": op.outcome, "replicas": sorted(reps)}
        (injected if during and (not reps or victim in reps) else unexpected).append(row)
    return {"in_flight_at_kill": in_flight, "injected": injected, "unexpected": unexpected}


async def _fleet_metrics(s: FleetSoak) -> dict[str, dict[str, float]]:
    """Every registered replica's ``/metrics`` (read from its own server), summed series by series."""
    m: dict[str, dict[str, float]] = {}
    with contextlib.suppress(httpx.HTTPError):
        for rep in (await rf.fleet_replicas(s))["replicas"]:
            r = await s.http.get(rep["url"] + "/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=10)
            for name, series in parse_metrics(r.text).items():
                for label, v in series.items():
                    m.setdefault(name, {})[label] = m.get(name, {}).get(label, 0.0) + v
    return m


def _one(m: dict[str, dict[str, float]], name: str) -> float:
    return m.get(name, {}).get("", float("nan"))


async def _fleet_sample(s: FleetSoak, pid: int, ops: list[Any], now: float) -> Sample:
    rss, fds, threads = tree_stats(pid)
    m = await _fleet_metrics(s)
    tiers = {k.split("=", 1)[1]: v for k, v in m.get("execstate_offload_tier_units", {}).items()
             if k.startswith("tier=")}
    sessions = {kind: sum(m.get(f"execstate_tenant_{kind}", {}).values())
                for kind in ("sessions", "agents", "hibernated_sessions", "checkpoints")}
    p50, p99, outcomes = window_stats(ops)
    return Sample(round(now, 1), rss, fds, threads, _one(m, "execstate_kv_blocks_used"),
                  _one(m, "execstate_num_requests_running"), _one(m, "execstate_num_requests_waiting"), tiers,
                  sessions, p50, p99, outcomes)


def descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, todo = [pid], [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, p in parents.items() if p == parent]
        out += kids
        todo += kids
    return out


def tree_stats(pid: int) -> tuple[float, int, int]:
    """(RSS MB, open fds, threads) summed over ``pid`` and its descendants (the whole fleet)."""
    from execstate_bench.soak_record import proc_stats

    rss, fds, threads = 0.0, 0, 0
    for p in descendants(pid):
        r, f, t = proc_stats(p)
        if f >= 0:
            rss, fds, threads = rss + r, fds + f, threads + t
    return round(rss, 1), fds, threads


async def _faults(s: FleetSoak, f: Faults, fleet: dict[str, Any], duration: float, stop: asyncio.Event) -> None:
    async def kill(s: FleetSoak, f: Faults) -> None:
        fleet["kill"] = k = await rf.replica_kill(s, fleet["residents"], fleet["replicas"])
        end = k["t_kill"] + (k["replacement_registered_s"] or rf.REPLACEMENT_DEADLINE_S)
        f.window("replica_killed", k["t_kill"], end, f"SIGKILL of {k['victim']}; until its replacement registered")

    async def update(s: FleetSoak, f: Faults) -> None:
        fleet["update"] = u = await rf.rolling_update(s, fleet["v1"], fleet["probe"])
        f.window("rolling_update", u["start"], u["end"], f"to other weights: HTTP {u['status']}")

    async def no_disk(s: FleetSoak, f: Faults) -> None:
        f.window("disk_full", s.now(), s.now(), "skipped: the CLI's fleet has no disk tier")

    await run_faults(s, f, duration, stop, [(0.0, no_disk), (0.10, redis_pause), (0.18, redis_full),
                                            (0.26, redis_down), (0.36, kill), (0.50, update), (0.58, bursts)])


async def _drain(s: FleetSoak, residents: list[rf.Resident], timeout_s: float = 120.0) -> float:
    await hc.close_leftovers(s)
    for res in residents:
        with contextlib.suppress(httpx.HTTPError):
            await s.http.delete(s.url + f"/v1/sessions/{res.sid}", headers={"Authorization": res.auth})
    deadline, used = time.monotonic() + timeout_s, float("nan")
    while time.monotonic() < deadline:
        m = await _fleet_metrics(s)
        used = _one(m, "execstate_kv_blocks_used")
        busy = _one(m, "execstate_num_requests_running") + _one(m, "execstate_num_requests_waiting")
        if busy == 0 and used == 0:
            break
        await asyncio.sleep(1.0)
    return used


async def _soak(url: str, pid: int, minutes: float, clients: int, period: float, faults: Faults,
                fleet: dict[str, Any], audio: bytes, weights: dict[str, int], max_rss_mb: float) -> dict[str, Any]:
    duration, stop = minutes * 60, asyncio.Event()
    tally, samples = Tally(), list[Sample]()
    holder: list[FleetSoak] = []

    async def named(response: httpx.Response) -> None:
        if holder and (rid := response.headers.get(rf.REPLICA_HEADER)):
            holder[0].saw(rid)

    limits = httpx.Limits(max_connections=400, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=120, limits=limits, event_hooks={"response": [named]}) as http:
        s = FleetSoak(url, KEYS, tally, time.monotonic(), http)
        holder.append(s)
        fleet["residents"] = residents = await rf.open_residents(s, rf.RESIDENTS_PER_REPLICA * fleet["replicas"])
        tasks = [asyncio.create_task(_client(s, i, stop, audio, weights)) for i in range(clients)]
        tasks += [asyncio.create_task(rf.residents_loop(s, residents, stop)),
                  asyncio.create_task(rf.version_probe(s, fleet["probe"], stop)),
                  asyncio.create_task(_sampler(s, pid, period, samples, stop, max_rss_mb, _fleet_sample))]
        fault_task = asyncio.create_task(_faults(s, faults, fleet, duration, stop))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), duration)
        stop.set()
        await asyncio.wait(tasks + [fault_task], timeout=300)
        for t in tasks + [fault_task]:
            t.cancel()
        results = await asyncio.gather(*tasks, fault_task, return_exceptions=True)
        end = s.now()
        leaked = await _drain(s, residents)
        final = await rf.fleet_replicas(s)
    warmup = min(0.2 * duration, 600.0)
    totals: dict[str, int] = {}
    for o in tally.ops:
        totals[f"{o.surface}:{o.outcome}"] = totals.get(f"{o.surface}:{o.outcome}", 0) + 1
    errors = classify(s, fleet.get("kill"))
    v = verdict(samples, tally, warmup, end, leaked, injected=[])
    v["unexpected_5xx"] = {"count": len(errors["unexpected"]), "first": errors["unexpected"][:5],
                           "met": not errors["unexpected"]}
    v["met"] = all(v[k]["met"] for k in ("rss", "fds", "leaked_blocks", "unexpected_5xx", "p99_trend"))
    return {"minutes": minutes, "clients": clients, "surfaces": sorted(weights), "warmup_s": warmup,
            "stopped_early": s.stopped_early, "operations": len(tally.ops), "totals": dict(sorted(totals.items())),
            "faults": faults.windows,
            "samples": [vars(x) for x in samples], "verdict": v,
            "fleet": _fleet_section(fleet, errors, final, [r for r in results if isinstance(r, BaseException)])}


def _fleet_section(fleet: dict[str, Any], errors: dict[str, Any], final: dict[str, Any],
                   crashed: list[BaseException]) -> dict[str, Any]:
    probe: rf.Probe = fleet["probe"]
    upd = fleet.get("update")
    during = [a for a in probe.answers if upd and a[0] <= upd["end"] and a[1] >= upd["start"]]  # in flight
    outside = [a for a in probe.answers if a not in during]

    def by_version(answers: list[tuple[float, float, str, str, bool]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in answers:
            out[a[2]] = out.get(a[2], 0) + 1
        return out

    return {"replicas": fleet["replicas"], "kill": fleet.get("kill"), "update": upd,
            "probe": {"answers": len(probe.answers), "by_version": by_version(probe.answers),
                      "during_update": len(during), "during_update_by_version": by_version(during),
                      "wrong_version_during_update": sum(not a[4] for a in during),
                      "wrong_outside_update": sum(not a[4] for a in outside)},
            "residents": {"sessions": len(fleet["residents"]),
                          "reopened_after_stale_state": sum(r.generation for r in fleet["residents"])},
            "errors": {"in_flight_at_kill": errors["in_flight_at_kill"], "injected": len(errors["injected"]),
                       "injected_list": errors["injected"], "unexpected": len(errors["unexpected"])},
            "resumed_total": len(final["resumed"]), "retried_total": final["retried"],
            "final_versions": sorted({r["weights_version"] for r in final["replicas"]}),
            "client_tasks_crashed": [repr(e) for e in crashed if not isinstance(e, asyncio.CancelledError)]}


def start_fleet(model: Path, keys_file: Path, redis: RedisServer | None, replicas: int, threads: int,
                log: Path) -> tuple[subprocess.Popen, str]:
    from execstate.fleet.cluster_plan import LOCAL_ONLY_ENV

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != LOCAL_ONLY_ENV}
    each = str(max(1, threads // replicas))
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=each, MKL_NUM_THREADS=each)
    args = [sys.executable, "-m", "execstate", "serve", str(model), "--ray", "--replicas", str(replicas), "--port",
            str(port), "--served-model-name", hc.NAME, "--enable-return-routed-experts", "--api-keys-file",
            str(keys_file), "--fleet-operator", "tenant-a", "--session-copy-every", "1", "--session-idle-ttl", "30"]
    if redis is not None:
        args += ["--offload-redis-url", redis.url]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(args, env=env, stdout=fh, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, url: str, log: Path, replicas: int, timeout_s: float = 900.0) -> float:
    t0 = time.monotonic()
    body = {"model": hc.NAME, "prompt": [5, 6, 7], "max_tokens": 2}
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the fleet exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"the fleet was not ready after {timeout_s:.0f} s:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            listed = httpx.get(url + "/v1/fleet/replicas", timeout=5, headers={"Authorization": f"Bearer {KEYS[0]}"})
            if len(listed.json()["replicas"]) >= replicas and \
                    httpx.post(url + "/v1/completions", json=body, timeout=60,
                               headers={"Authorization": f"Bearer {KEYS[0]}"}).status_code == 200:
                return time.monotonic() - t0
        time.sleep(1.0)


def stop_fleet(proc: subprocess.Popen) -> None:
    """SIGINT (the CLI shuts Serve and its Ray cluster down), then SIGKILL of what is left of the
    processes it started (by their ids)."""
    started = descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    for pid in started[1:]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_ray_soak(minutes: float = 2.0, clients: int = 4, replicas: int = 2, period: float | None = None,
                 threads: int = 2, skip: tuple[str, ...] = (), max_rss_mb: float = 18000.0) -> dict[str, Any]:
    """The fleet soak (module docstring); its report (``soak.run_soak``'s, plus ``fleet``).
    ``max_rss_mb``: the RSS guard, on the sum over the fleet's processes."""
    unknown = sorted(set(skip) - set(RAY_WEIGHTS))
    if unknown:
        raise ValueError(f"unknown soak operation(s) for --ray {unknown}; known: {sorted(RAY_WEIGHTS)}")
    weights = {k: v for k, v in RAY_WEIGHTS.items() if k not in skip}
    work = Path(tempfile.mkdtemp(prefix="execstate-soak-ray-"))
    model = build_model(work / "model")
    v1 = work / "v1"
    from execstate.model.random_models import make_random

    make_random("qwen3_moe", v1, seed=1, max_position_embeddings=2048)  # same shapes, other weights
    rng = random.Random(0)
    prompts = [hc.ids(rng, 12) for _ in range(8)]
    probe = rf.Probe(prompts, {"v0": rf.oracle_tokens(model, prompts), "v1": rf.oracle_tokens(v1, prompts)})
    keys_file = work / "keys"
    keys_file.write_text(f"{KEYS[0]} tenant-a\n{KEYS[1]} tenant-b\n")
    redis = RedisServer(work / "redis").start() if redis_server_available() else None
    log = work / "fleet.log"
    load_before = loadavg()
    proc, url = start_fleet(model, keys_file, redis, replicas, threads, log)
    try:
        ready_s = wait_ready(proc, url, log, replicas)
        from execstate_bench import soak_sockets as ws

        audio = ws.speech() if "voice" in weights else b""
        fleet = {"replicas": replicas, "probe": probe, "v1": v1, "ready_s": round(ready_s, 1)}
        report = asyncio.run(_soak(url, proc.pid, minutes, clients, period or max(2.0, minutes * 60 / 120),
                                   Faults(redis, None, False), fleet, audio, weights, max_rss_mb))
        report["fleet"]["ready_s"] = fleet["ready_s"]
        report["fleet"]["alive_at_end"] = proc.poll() is None
    finally:
        stop_fleet(proc)
        if redis is not None:
            redis.kill()
    report["server_problems"] = log_problems(log.read_text(errors="replace"))
    shutil.rmtree(work, ignore_errors=True)
    report.update(ray=True, cpu=cpu_name(), loadavg_before=load_before, loadavg_after=loadavg(),
                  disk_tier="none (the CLI's fleet has no disk tier)", redis=redis is not None)
    return report
