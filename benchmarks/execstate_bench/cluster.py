"""``execstate bench cluster``: the fleet (docs/fleet.md) under a shared-prefix multi-turn
workload, for each replica count and router (docs/benchmarks.md).

One local Ray cluster for the whole run. For each ``(replicas, router)`` the fleet is deployed
fresh (``fleet_app``: empty caches, the router's ``policy``), the replicas are warmed with one short
unrelated prompt each, the engines' prefix-cache counters are read, the same
:class:`~execstate_bench.cluster_workload.ClusterWorkload` runs (``cluster_client.py``), the
counters are read again, and the application is deleted. With one replica every router routes
the same way, so it runs once (``router: "any"``). Optionally (``kill``) a last run of execstate's
router at the largest replica count SIGKILLs one replica (its PID from its routing stats) part-way
through and measures what failed, what was retried and how long until a replacement served.
Reported per run: TTFT p50/p99 of the streamed completions, throughput (generated tokens/s,
requests/s), the engines' own prefix hit rate (hit tokens / looked-up tokens, summed over
replicas) and the prompt tokens they computed (looked up - hit: the work the routing caused,
which load on a shared machine does not change), and each replica's requests and hit rate.
``kv_blocks`` (each replica's KV pool) is sized so one replica cannot hold every system prompt
while the fleet can: what a prefix-aware router gains is the fleet's aggregate cache.
``cluster_report.py`` formats and plots.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from execstate_bench.cluster_client import run_workload
from execstate_bench.cluster_workload import ClusterWorkload, Turn
from execstate_bench.machine import cpu_name, loadavg

if TYPE_CHECKING:
    from execstate.fleet.ray_app.session_settings import SessionSettings

NAME = "bench-model"
APP = "execstate"
ROUTERS = ("round_robin", "power_of_two", "text_prefix", "execstate")


def bench_model(model: str, workdir: Path) -> Path:
    """``tiny``: the tests' tiny Qwen3-MoE (3 layers, hidden 64, 8 experts) with 4096 positions and
    the tiny tokenizer; anything else: ``resolve_bench_model``."""
    if model != "tiny":
        from execstate_bench.models import resolve_bench_model

        return resolve_bench_model(model)
    from execstate.model.random_models import make_random
    from execstate.model.random_tokenizer import write_tokenizer

    d = make_random("qwen3_moe", workdir / "tiny-moe", seed=0, max_position_embeddings=4096)
    write_tokenizer(d)
    return d


def run_cluster_bench(model: str = "tiny", replicas: tuple[int, ...] = (1, 2, 3), routers: tuple[str, ...] = ROUTERS,
                      workload: ClusterWorkload | None = None, kill: bool = False, kill_after: float = 0.3,
                      block_size: int = 16, kv_blocks: int | None = 384, replica_cpus: float = 0.5) -> dict[str, Any]:
    try:
        import ray.serve  # noqa: F401 - checked before the model is built; the cluster is local_cluster()'s
    except ImportError as e:
        raise ImportError(f"bench cluster needs Ray Serve: pip install 'execstate[fleet]' ({e})") from e

    from execstate.fleet.ray_app.session_settings import SessionSettings

    w = workload or ClusterWorkload()
    report: dict[str, Any] = {"cpu": cpu_name(), "cpus": os.cpu_count(), "load_before": loadavg(), "model": model,
                              "workload": asdict(w), "block_size": block_size, "kv_blocks_per_replica": kv_blocks,
                              "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_model(model, Path(tmp))
        with local_cluster() as url:
            kwargs = {"seed": 0, "block_size": block_size, "num_kv_blocks": kv_blocks}
            keys = Path(tmp) / "keys.txt"
            keys.write_text(w.keys_file_text())
            settings = SessionSettings(api_keys_file=str(keys) if w.tenants > 1 else None,
                                       shared_prefix_groups=w.sharing())
            for n in replicas:
                for router in (("any",) if n == 1 else routers):
                    report["runs"].append(_one_run(url, path, n, router, w, kwargs, replica_cpus, None, settings))
            if kill and max(replicas) > 1:
                report["kill"] = _one_run(url, path, max(replicas), "execstate", w, kwargs, replica_cpus, kill_after,
                                          settings)
    report["load_after"] = loadavg()
    return report


def _one_run(url: str, path: Path, n: int, router: str, w: ClusterWorkload, kwargs: dict[str, Any],
             replica_cpus: float, kill_after: float | None, settings: SessionSettings) -> dict[str, Any]:
    from ray import serve

    from execstate.fleet.ray_app.app import fleet_app

    policy = "execstate" if router == "any" else router
    t_deploy = time.perf_counter()
    serve.run(fleet_app(str(path), n, NAME, kwargs, router={"policy": policy, "seed": 0}, replica_cpus=replica_cpus,
                        sessions=settings), name=APP, route_prefix="/")
    ids = _wait_replicas(url, n, headers=w.headers(0))
    deploy_s = time.perf_counter() - t_deploy
    for i in range(n):  # warm every replica (first forward) with a prompt sharing nothing with the workload
        httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": list(range(600 + i, 608 + i)),
                                                   "max_tokens": 2, "temperature": 0}, headers=w.headers(0),
                   timeout=120)
    before = asyncio.run(_stats(ids))
    t0 = time.perf_counter()
    kill: dict[str, Any] | None = None
    if kill_after is None:
        turns = asyncio.run(run_workload(url, NAME, w, t0))
        wall = time.perf_counter() - t0
    else:
        turns, kill, wall = asyncio.run(_with_kill(url, w, t0, ids, kill_after))
        ids = [r for r in ids if r != kill["replica"]] + [kill["replacement"]]
    after = asyncio.run(_stats(ids))
    serve.delete(APP)
    run = summarize(turns, wall, before, after)
    run.update({"replicas": n, "router": router, "deploy_s": deploy_s})
    if kill is not None:
        run["kill"] = _kill_summary(turns, kill)
    return run


def _wait_replicas(url: str, n: int, timeout_s: float = 180.0, known: set[str] | None = None,
                   headers: dict[str, str] | None = None) -> list[str]:
    """The ids of ``n`` registered replicas not in ``known``; ``headers``: a key on a keyed fleet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            listed = httpx.get(url + "/v1/fleet/replicas", timeout=10, headers=headers)
            got = [r["replica_id"] for r in listed.json()["replicas"]]
        except (httpx.HTTPError, ValueError, KeyError):
            got = []
        fresh = [r for r in got if known is None or r not in known]
        if len(fresh) >= n:
            return fresh
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} replicas did not register in {timeout_s} s (got {got})")
        time.sleep(0.2)


async def _stats(replica_ids: list[str]) -> dict[str, dict[str, Any]]:
    from ray import serve

    from execstate.fleet.ray_app.app import ENGINES
    from execstate.fleet.router.policy import RouteRequest

    handle = serve.get_deployment_handle(ENGINES, APP)
    out = {}
    for rid in replica_ids:
        out[rid] = await handle.describe.remote(RouteRequest(session_replica=rid))
    return out


async def _with_kill(url: str, w: ClusterWorkload, t0: float, ids: list[str],
                     kill_after: float) -> tuple[list[Turn], dict[str, Any], float]:
    """The workload with a SIGKILL of the replica that served the most requests so far once
    ``kill_after`` of the requests finished; then waits for Ray's replacement to register."""
    turns: list[Turn] = []
    done_at: list[float] = []

    async def workload() -> list[Turn]:
        await run_workload(url, NAME, w, t0, turns)
        done_at.append(time.perf_counter() - t0)
        return turns

    async def killer() -> dict[str, Any]:
        while len(turns) < kill_after * w.requests:
            await asyncio.sleep(0.02)
        served = [t.replica for t in turns if t.replica in ids]
        victim = max(ids, key=served.count)
        pid = (await _stats([victim]))[victim]["pid"]
        os.kill(pid, signal.SIGKILL)
        killed = time.perf_counter() - t0
        replacement = await asyncio.to_thread(_wait_replicas, url, 1, 180.0, set(ids))
        return {"replica": victim, "pid": pid, "at_s": killed, "replacement": replacement[0],
                "replacement_registered_s": time.perf_counter() - t0 - killed}

    _, kill = await asyncio.gather(workload(), killer())
    return sorted(turns, key=lambda t: t.start), kill, done_at[0]


def _kill_summary(turns: list[Turn], kill: dict[str, Any]) -> dict[str, Any]:
    at = kill["at_s"]
    after = [t for t in turns if t.start + (t.latency or 0) >= at]
    ok_after = sorted(t.start + (t.latency or 0) for t in after if t.error is None and t.start >= at)
    failed = [t for t in turns if t.error is not None]
    return {**kill, "failed": len(failed), "errors": sorted({t.error or "" for t in failed})[:5],
            "failed_mid_stream": sum(1 for t in failed if t.ttft is not None),
            "started_after_kill_ok": sum(1 for t in after if t.error is None and t.start >= at),
            "first_success_after_kill_s": (ok_after[0] - at) if ok_after else None}


def summarize(turns: list[Turn], wall: float, before: dict[str, dict[str, Any]],
              after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One run's numbers (module docstring); ``before``/``after``: each replica's routing stats."""
    ttft = np.array([t.ttft for t in turns if t.kind == "completion" and t.ttft is not None and t.error is None])
    steps = np.array([t.latency for t in turns if t.kind == "session" and t.error is None and t.latency])
    per: dict[str, dict[str, Any]] = {}
    for rid, a in after.items():
        b = before.get(rid, {})
        hit = a["prefix_hit_tokens"] - b.get("prefix_hit_tokens", 0)
        looked = a["prefix_lookup_tokens"] - b.get("prefix_lookup_tokens", 0)
        per[rid] = {"requests": sum(1 for t in turns if t.replica == rid), "hit_tokens": hit,
                    "lookup_tokens": looked, "hit_rate": hit / looked if looked else 0.0}
    hit = sum(p["hit_tokens"] for p in per.values())
    looked = sum(p["lookup_tokens"] for p in per.values())
    tokens = sum(t.tokens for t in turns if t.error is None)
    return {"requests": len(turns), "errors": sum(1 for t in turns if t.error is not None), "wall_s": wall,
            "prompt_tokens_computed": looked - hit,
            "ttft_p50_ms": _pct(ttft, 50), "ttft_p99_ms": _pct(ttft, 99), "session_step_p50_ms": _pct(steps, 50),
            "tokens_per_s": tokens / wall, "requests_per_s": len(turns) / wall,
            "prefix_hit_rate": hit / looked if looked else 0.0, "per_replica": per}


def _pct(xs: np.ndarray, q: float) -> float | None:
    return float(np.percentile(xs, q) * 1000) if len(xs) else None


@contextmanager
def local_cluster() -> Iterator[str]:
    """A local Ray cluster on every CPU with Serve's HTTP proxy on a free port (the cluster
    benches'): its URL; Serve and Ray shut down after."""
    import ray
    from ray import serve

    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
