"""``execstate bench pd``: prefill/decode disaggregation against a single instance, over HTTP.

Processes (all ``execstate serve`` / ``execstate proxy`` subprocesses on 127.0.0.1, R3 on;
``pd_cluster``, which also explains their threads), started in two phases so that no more
NIXL agents than needed are alive while timing:

1. ``single`` (one instance, no connector), ``prefill`` (kv_producer) + ``decode``
   (kv_consumer) + ``proxy``: the timed workload;
2. then ``decode_fail`` + ``proxy_fail`` (a corrupting importer, started through the test/bench
   launcher ``execstate_bench/faulty_serve.py``; policy ``fail``) and
   ``decode_recompute`` + ``proxy_recompute`` (same fault, policy ``recompute``), both
   pulling from the same prefill instance: the failure checks.

Workload (docs/contracts.md 9; ``pd_measure``): per repeat, ``num_prompts`` fresh prompts of
``prompt_len`` random token ids, each sent once, streamed, one request at a time, to the
single instance and through the proxy, interleaved; TTFT and tok/s per request, after a
warm-up request per path. Transfer figures come from the decode instance's ``/metrics``
(``pd_report``); recovery = error received -> retry through the healthy path served
(``pd_measure``). The printed table: ``pd_table``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from execstate_bench.machine import loadavg
from execstate_bench.models import STANDARD, resolve_bench_model
from execstate_bench.pd_client import scrape
from execstate_bench.pd_cluster import Cluster, kv_config
from execstate_bench.pd_measure import failure_and_recovery, sha256_bytes_per_s, timed_runs, warm_up
from execstate_bench.pd_report import build_report
from execstate_bench.pd_table import format_table

__all__ = ["run_pd_bench", "format_table"]

WARMUP_LEN = 256


def run_pd_bench(
    model: str | Path = STANDARD,
    prompt_len: int = 2048,
    num_prompts: int = 4,
    max_tokens: int = 32,
    repeats: int = 3,
    *,
    threads: int | None = None,
    nice_busy_threads: bool = False,
    seed: int = 0,
    print_table: bool = True,
) -> dict[str, Any]:
    """Start the processes, run the workload and the failure checks, stop everything; the report."""
    import httpx

    from execstate.model.config import ModelConfig

    t_bench = time.perf_counter()
    threads = int(threads or os.cpu_count() or 1)
    path = resolve_bench_model(model)
    mc = ModelConfig.from_hf_dir(path)
    rng_base = [seed, prompt_len]

    def prompts(kind: int, r: int, n: int, length: int = prompt_len) -> list[list[int]]:
        return np.random.default_rng([*rng_base, kind, r]).integers(3, mc.vocab_size, (n, length)).tolist()

    load_before = loadavg()
    cluster = Cluster(threads)
    client = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0))
    try:
        # phase 1: single instance and the PD path (only two NIXL agents alive while timing)
        cluster.serve("single", path)
        p = cluster.serve("prefill", path, kv_config("kv_producer"))
        d = cluster.serve("decode", path, kv_config("kv_consumer"))
        cluster.proxy("proxy", p, d)
        startup_s = cluster.wait_healthy(client)
        procs = cluster.procs
        warm_full, warm_short = prompts(9, 0, 1)[0], prompts(9, 1, 1, min(prompt_len, WARMUP_LEN))[0]
        warm_up(client, cluster, ["single", "proxy"], warm_full)  # full length: the first big prefill
        idle = cluster.idle_profile(["single", "prefill", "decode"])
        niced = cluster.nice_busy_threads(idle) if nice_busy_threads else {}
        sha = sha256_bytes_per_s()  # here: same conditions as the timed runs (one thread, this process)
        cpu0 = {n: pr.cpu_seconds() for n, pr in procs.items()}
        d0 = scrape(client, d)
        runs, mismatches = timed_runs(client, cluster, [prompts(0, r, num_prompts) for r in range(repeats)],
                                      max_tokens)
        d1 = scrape(client, d)
        cpu_timed = {n: round(pr.cpu_seconds() - cpu0[n], 2) for n, pr in procs.items()}

        # phase 2: injected failures (a corrupting decode instance per policy, each behind its proxy)
        cluster.serve("decode_fail", path, kv_config("kv_consumer", "fail"), fault="corrupt")
        cluster.serve("decode_recompute", path, kv_config("kv_consumer", "recompute"), fault="corrupt")
        cluster.proxy("proxy_fail", p, procs["decode_fail"].url)
        cluster.proxy("proxy_recompute", p, procs["decode_recompute"].url)
        cluster.wait_healthy(client, ["decode_fail", "decode_recompute", "proxy_fail", "proxy_recompute"])
        warm_up(client, cluster, ["proxy_fail"], warm_short)
        warm_up(client, cluster, ["proxy_recompute"], prompts(9, 2, 1)[0])
        if nice_busy_threads:
            idle2 = cluster.idle_profile(["decode_fail", "decode_recompute"])
            niced.update(cluster.nice_busy_threads(idle2))
        recovery = failure_and_recovery(client, cluster, prompts(1, 0, 2), max_tokens)

        report = build_report(model, path, mc, threads, startup_s, runs, mismatches, d0, d1, recovery, sha,
                              dict(prompt_len=prompt_len, num_prompts=num_prompts, max_tokens=max_tokens,
                                   repeats=repeats, seed=seed))
        report["idle_profile"] = idle
        report["niced_threads"] = niced
        report["cpu_seconds_timed_phase"] = cpu_timed
    finally:
        client.close()
        cluster.close()
    report["machine"] = {"cpu_count": os.cpu_count(), "loadavg_before": load_before,
                         "loadavg_after": loadavg(), "python": sys.version.split()[0]}
    report["bench_seconds"] = time.perf_counter() - t_bench
    if print_table:
        print(format_table(report))
    return report
