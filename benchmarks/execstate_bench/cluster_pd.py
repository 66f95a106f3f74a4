"""``execstate bench cluster-pd``: a PD fleet (``fleet_app(pd=(P, D))``) against a plain fleet of
``P + D`` replicas, under the same shared-prefix multi-turn workload (``cluster_workload.py``) with
execstate's router (docs/fleet.md, "PD as two deployments").

One local Ray cluster; the two shapes run alternately ``rounds`` times (plain, PD, plain, PD ...:
a shared machine's load drifts, alternating spreads the drift over both), each a fresh
deployment (empty caches) warmed with one short unrelated prompt per replica, then the workload
(``cluster_client.run_workload``: streamed completions, TTFT = the first SSE chunk with tokens),
then the engines' counters. Reported per run: TTFT p50/p99, generated tokens/s, errors, and per
replica the requests it answered and its prefix-cache hit and lookup tokens (a PD fleet's prefill
replicas compute the prompts; its decode replicas look the prompt up in their own cache, then
load the rest from the prefill replica: those tokens are not hits). Sessions are off by default:
a PD fleet runs them whole on a decode replica, which is not what is compared here.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from execstate_bench.cluster import APP, NAME, _wait_replicas, bench_model, local_cluster, summarize
from execstate_bench.cluster_client import run_workload
from execstate_bench.cluster_workload import ClusterWorkload
from execstate_bench.machine import cpu_name, loadavg

SMALL = ClusterWorkload(users=16, systems=4, system_len=512, turns=3, user_len=64, reply_len=16, session_users=0,
                        concurrency=4)


def run_cluster_pd_bench(model: str = "tiny", pd: tuple[int, int] = (1, 1), workload: ClusterWorkload | None = None,
                         rounds: int = 1, block_size: int = 16, kv_blocks: int | None = 384,
                         replica_cpus: float = 0.5) -> dict[str, Any]:
    try:
        import ray.serve  # noqa: F401 - checked before the model is built; the cluster is local_cluster()'s
    except ImportError as e:
        raise ImportError(f"bench cluster-pd needs Ray Serve: pip install 'execstate[fleet]' ({e})") from e

    w = workload or SMALL
    report: dict[str, Any] = {"cpu": cpu_name(), "cpus": os.cpu_count(), "load_before": loadavg(), "model": model,
                              "pd": list(pd), "workload": asdict(w), "block_size": block_size,
                              "kv_blocks_per_replica": kv_blocks, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_model(model, Path(tmp))
        with local_cluster() as url:
            kwargs = {"seed": 0, "block_size": block_size, "num_kv_blocks": kv_blocks}
            for r in range(rounds):
                for shape in ("plain", "pd"):
                    run = _one_run(url, path, shape, pd, w, kwargs, replica_cpus)
                    run["round"] = r
                    report["runs"].append(run)
    report["load_after"] = loadavg()
    return report


def _one_run(url: str, path: Path, shape: str, pd: tuple[int, int], w: ClusterWorkload, kwargs: dict[str, Any],
             replica_cpus: float) -> dict[str, Any]:
    from ray import serve

    from execstate.fleet.ray_app.app import fleet_app

    n = pd[0] + pd[1]
    t_deploy = time.perf_counter()
    app = fleet_app(str(path), n, NAME, kwargs, replica_cpus=replica_cpus, pd=pd if shape == "pd" else None)
    serve.run(app, name=APP, route_prefix="/")
    ids = _wait_replicas(url, n)
    deploy_s = time.perf_counter() - t_deploy
    for i in range(n):  # warm the replicas (first forward) with prompts sharing nothing with the workload
        httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": list(range(600 + i, 608 + i)),
                                                   "max_tokens": 2, "temperature": 0}, timeout=120)
    before = asyncio.run(_describe(ids))
    t0 = time.perf_counter()
    turns = asyncio.run(run_workload(url, NAME, w, t0))
    wall = time.perf_counter() - t0
    after = asyncio.run(_describe(ids))
    serve.delete(APP)
    run = summarize(turns, wall, before, after)
    run.update({"shape": shape, "replicas": n, "deploy_s": deploy_s})
    return run


async def _describe(replica_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each replica's routing stats, through the handle of its deployment (the id names it)."""
    from ray import serve

    from execstate.fleet.router.policy import RouteRequest

    out = {}
    for rid in replica_ids:
        deployment = rid.split("#")[1]
        handle = serve.get_deployment_handle(deployment, APP)
        out[rid] = await handle.describe.remote(RouteRequest(session_replica=rid))
    return out


def format_cluster_pd_table(report: dict[str, Any]) -> str:
    p, d = report["pd"]
    lines = [f"PD fleet ({p} prefill + {d} decode) vs plain fleet ({p + d} replicas), execstate's router; "
             f"model {report['model']}, {report['cpus']} CPUs, load {report['load_before']} -> {report['load_after']}",
             "| round | fleet | TTFT p50 | TTFT p99 | tok/s | errors | replica: answered, prefix hit rate |",
             "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        per = " / ".join(f"{rid.split('#')[1]} {v['requests']}, {100 * v['hit_rate']:.0f} %"
                         for rid, v in sorted(r["per_replica"].items()))
        lines.append(f"| {r['round']} | {r['shape']} | {_ms(r['ttft_p50_ms'])} | {_ms(r['ttft_p99_ms'])} | "
                     f"{r['tokens_per_s']:.1f} | {r['errors']} | {per} |")
    return "\n".join(lines)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} ms"
