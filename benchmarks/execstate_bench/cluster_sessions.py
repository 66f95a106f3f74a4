"""``execstate bench cluster --scenario sessions``: live sessions through a drain and a SIGKILL,
on one timeline (docs/fleet.md "Benchmark: drain and kill with live sessions").

One local Ray cluster, one ``redis-server`` (the replicas' shared tier), a fleet of ``replicas``
engine replicas copying their live sessions to it every ``copy_every_s``. Sessions are opened
through the ingress until one replica holds ``live_sessions`` (the others keep ``others`` each;
extra ones are closed), each gets a first step (a ``first_len``-token prompt), then every
session is a client that steps (``step_len`` new tokens, ``reply_len`` generated) and waits
``think_s``, until the end. Meanwhile:

1. at ``warm_s``: ``POST /v1/fleet/drain`` of the replica holding ``live_sessions``: its sessions
   move with the two-phase migration while their clients keep stepping. Measured: the drain's
   seconds, sessions moved / failed, and **lost**: a session counts as lost if any of its steps
   after the drain began was answered ``not_found``/``session_lost``, or its step indices skip or
   repeat one (a step served twice or dropped);
2. ``settle_s`` after the drain: SIGKILL of the replica now holding the most sessions. Measured:
   its sessions, how many were resumed on another replica (the ingress's list), the steps each
   lost (its last step index before the kill minus the one its copy resumed at), the requests
   that failed (those in flight on the killed replica), and the **recovery**: per session, from
   the kill to its first step served elsewhere (p50, max);
3. the run stops ``settle_s`` after every session of the killed replica stepped again (or
   ``recover_timeout_s``).

Every step is recorded (start, end, replica, status, step index), and ``cluster_timeline.py``
plots them. The tiny model by default: this measures the fleet's machinery, not the model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from execstate_bench.cluster import APP, NAME, _wait_replicas, bench_model, local_cluster
from execstate_bench.machine import cpu_name, loadavg

REPLICA_HEADER = "x-execstate-replica"


@dataclass(frozen=True)
class SessionsScenario:
    replicas: int = 3
    live_sessions: int = 10
    others: int = 3
    first_len: int = 256
    step_len: int = 16
    reply_len: int = 8
    think_s: float = 0.3
    warm_s: float = 8.0
    settle_s: float = 8.0
    copy_every_s: float = 1.0
    recover_timeout_s: float = 180.0


@dataclass
class StepRecord:
    session: str
    start: float  # seconds since the run's origin
    end: float
    replica: str | None
    status: int  # HTTP status; 0: no answer (connection cut, timeout)
    step_index: int | None
    error: str | None = None


@dataclass
class Timeline:
    steps: list[StepRecord] = field(default_factory=list)
    homes: dict[str, str] = field(default_factory=dict)  # session -> the replica it was opened on
    marks: dict[str, Any] = field(default_factory=dict)  # drain/kill times and answers


def run_sessions_bench(model: str = "tiny", scenario: SessionsScenario | None = None, block_size: int = 16,
                       replica_cpus: float = 0.5) -> dict[str, Any]:
    from ray import serve

    from execstate.fleet.ray_app.app import fleet_app
    from execstate.fleet.ray_app.session_settings import SessionSettings
    from execstate_bench.redis_server import RedisServer

    sc = scenario or SessionsScenario()
    report: dict[str, Any] = {"scenario_kind": "sessions", "cpu": cpu_name(), "cpus": os.cpu_count(),
                              "load_before": loadavg(), "model": model, "scenario": asdict(sc)}
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_model(model, Path(tmp))
        redis = RedisServer(Path(tmp) / "redis").start()
        try:
            with local_cluster() as url:
                t_deploy = time.perf_counter()
                serve.run(fleet_app(str(path), sc.replicas, NAME, {"seed": 0, "block_size": block_size},
                                    router={"policy": "execstate", "seed": 0}, replica_cpus=replica_cpus,
                                    shared_tier=redis.url, sessions=SessionSettings(copy_every_s=sc.copy_every_s)),
                          name=APP, route_prefix="/")
                _wait_replicas(url, sc.replicas)
                report["deploy_s"] = time.perf_counter() - t_deploy
                timeline = asyncio.run(_scenario(url, sc))
                report["replicas"] = httpx.get(url + "/v1/fleet/replicas", timeout=30).json()
        finally:
            redis.kill()
    report["load_after"] = loadavg()
    report.update(summarize_sessions(timeline, report["replicas"].get("resumed", [])))
    steps = [{k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(s).items()} for s in timeline.steps]
    report["timeline"] = {"steps": steps, "homes": timeline.homes, "marks": timeline.marks}
    return report


async def _scenario(url: str, sc: SessionsScenario) -> Timeline:
    tl = Timeline()
    rng = np.random.default_rng(0)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await _open_sessions(client, sc, tl, rng)
        origin = time.perf_counter()
        tl.marks["origin_wall"] = time.time()
        stop = asyncio.Event()
        clients = [asyncio.create_task(_client(client, sid, sc, tl, origin, stop, k)) for k, sid in
                   enumerate(tl.homes)]
        await asyncio.sleep(sc.warm_s)
        drained = max(set(tl.homes.values()), key=list(tl.homes.values()).count)
        tl.marks["drain_start"] = time.perf_counter() - origin
        answer = (await client.post("/v1/fleet/drain", json={"replica": drained, "timeout_s": 120})).json()
        tl.marks.update(drain_end=time.perf_counter() - origin, drained=drained, drain=answer)
        await asyncio.sleep(sc.settle_s)
        now = _current_homes(tl)
        victim = max((r for r in set(now.values()) if r != drained), key=list(now.values()).count)
        info = {r["replica_id"]: r for r in (await client.get("/v1/fleet/replicas")).json()["replicas"]}
        os.kill(info[victim]["pid"], signal.SIGKILL)
        t_kill = time.perf_counter() - origin
        tl.marks.update(kill=t_kill, victim=victim, on_victim=sorted(s for s, r in now.items() if r == victim))
        deadline = time.monotonic() + sc.recover_timeout_s
        while time.monotonic() < deadline and not all(_served_after(tl, s, t_kill) for s in tl.marks["on_victim"]):
            await asyncio.sleep(0.1)
        tl.marks["recovered"] = all(_served_after(tl, s, t_kill) for s in tl.marks["on_victim"])
        await asyncio.sleep(sc.settle_s)
        stop.set()
        await asyncio.gather(*clients)
        tl.marks["end"] = time.perf_counter() - origin
    return tl


async def _open_sessions(client: httpx.AsyncClient, sc: SessionsScenario, tl: Timeline,
                         rng: np.random.Generator) -> None:
    """Open sessions until one replica holds ``live_sessions``; close the extras elsewhere."""
    sampling = {"temperature": 0.8, "max_tokens": sc.reply_len, "ignore_eos": True}
    for k in range(sc.live_sessions * (sc.replicas + 2)):
        r = await client.post("/v1/sessions", json={"sampling": {**sampling, "seed": k}})
        r.raise_for_status()
        tl.homes[r.json()["session_id"]] = r.headers[REPLICA_HEADER]
        if max(list(tl.homes.values()).count(h) for h in tl.homes.values()) >= sc.live_sessions:
            break
    full = max(set(tl.homes.values()), key=list(tl.homes.values()).count)
    for home in set(tl.homes.values()) - {full}:
        for sid in [s for s, h in tl.homes.items() if h == home][sc.others:]:
            (await client.delete(f"/v1/sessions/{sid}")).raise_for_status()
            del tl.homes[sid]
    for sid in tl.homes:
        first = rng.integers(3, 500, sc.first_len).tolist()
        (await client.post(f"/v1/sessions/{sid}/step", json={"input": first})).raise_for_status()


async def _client(client: httpx.AsyncClient, sid: str, sc: SessionsScenario, tl: Timeline, origin: float,
                  stop: asyncio.Event, k: int) -> None:
    rng = np.random.default_rng(1000 + k)
    await asyncio.sleep(k * sc.think_s / max(1, len(tl.homes)))  # spread the clients' phases
    while not stop.is_set():
        t = time.perf_counter() - origin
        body = {"input": rng.integers(3, 500, sc.step_len).tolist()}
        try:
            r = await client.post(f"/v1/sessions/{sid}/step", json=body)
            data = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            err = None if r.status_code == 200 else str((data.get("error") or {}).get("type") or
                                                        (data.get("error") or {}).get("code") or r.text[:80])
            rec = StepRecord(sid, t, time.perf_counter() - origin, r.headers.get(REPLICA_HEADER), r.status_code,
                             data.get("step_index") if r.status_code == 200 else None, err)
        except (httpx.HTTPError, ValueError) as e:
            rec = StepRecord(sid, t, time.perf_counter() - origin, None, 0, None, type(e).__name__)
        tl.steps.append(rec)
        await asyncio.sleep(sc.think_s)


def _current_homes(tl: Timeline) -> dict[str, str]:
    """Each session's replica: the one that served its latest successful step."""
    now = dict(tl.homes)
    for s in sorted(tl.steps, key=lambda s: s.end):
        if s.status == 200 and s.replica is not None:
            now[s.session] = s.replica
    return now


def _served_after(tl: Timeline, sid: str, t: float) -> bool:
    return any(s.session == sid and s.status == 200 and s.start > t for s in tl.steps)


def summarize_sessions(tl: Timeline, resumed: list[dict[str, Any]]) -> dict[str, Any]:
    """The drain's and the kill's numbers (module docstring) from a run's records."""
    m = tl.marks
    by: dict[str, list[StepRecord]] = {}
    for s in sorted(tl.steps, key=lambda s: s.start):
        by.setdefault(s.session, []).append(s)
    on_drained = [sid for sid, h in tl.homes.items() if h == m["drained"]]
    lost_drain = []
    for sid in on_drained:
        ok = [s for s in by.get(sid, []) if s.status == 200 and s.end < m["kill"]]
        seq = [s.step_index for s in ok if s.step_index is not None]  # a 200 names its step
        gone = any(s.status == 404 for s in by.get(sid, []) if m["drain_start"] <= s.start < m["kill"])
        continuous = bool(seq) and seq == list(range(seq[0], seq[0] + len(seq)))
        if gone or not continuous:
            lost_drain.append(sid)
    refused = [s for s in tl.steps if s.status != 200 and m["drain_start"] <= s.start <= m["drain_end"]]
    gaps = []
    for sid in on_drained:
        ends = [s.end for s in by.get(sid, []) if s.status == 200]
        gaps += [b - a for a, b in zip(ends, ends[1:], strict=False) if b >= m["drain_start"] and a <= m["drain_end"]]
    drain = m["drain"]
    recov, lost_steps, lost_kill = [], {}, []
    mine = {r["session_id"]: r for r in resumed}
    for sid in m["on_victim"]:
        before = [s for s in by.get(sid, []) if s.status == 200 and s.end <= m["kill"]]
        after = [s for s in by.get(sid, []) if s.status == 200 and s.start > m["kill"]]
        if not after:
            lost_kill.append(sid)
            continue
        recov.append(after[0].end - m["kill"])
        if before and sid in mine and mine[sid].get("step_index") is not None:
            lost_steps[sid] = before[-1].step_index - mine[sid]["step_index"]
    failed_kill = [s for s in tl.steps if s.status != 200 and s.start <= m["kill"] + max(recov, default=0)
                   and s.end >= m["kill"]]
    return {
        "sessions": len(tl.homes), "steps": len(tl.steps), "steps_ok": sum(s.status == 200 for s in tl.steps),
        "drain": {"replica": m["drained"], "sessions": len(on_drained), "seconds": drain.get("seconds"),
                  "moved": len(drain.get("moved", [])), "failed": len(drain.get("failed", [])),
                  "idle": drain.get("idle"), "lost": len(lost_drain), "lost_sessions": lost_drain,
                  "steps_refused_during": len(refused),
                  "step_gap_max_s": max(gaps, default=None), "at_s": m["drain_start"]},
        "kill": {"replica": m["victim"], "sessions": len(m["on_victim"]), "at_s": m["kill"],
                 "resumed": sum(1 for sid in m["on_victim"] if sid in mine), "lost": len(lost_kill),
                 "steps_lost": lost_steps, "requests_failed": len(failed_kill),
                 "errors": sorted({s.error or "" for s in failed_kill})[:5],
                 "recovery_p50_s": float(np.median(recov)) if recov else None,
                 "recovery_max_s": max(recov, default=None),
                 "resume_max_s": max((mine[s]["seconds"] for s in m["on_victim"] if s in mine), default=None),
                 "recovered": m["recovered"]},
    }
