"""``execstate bench load``: a load test against one real ``execstate serve`` process.

Phases, one server (route return on, ``--max-num-seqs S --max-waiting-requests W``):

1. **steady**: ``clients`` concurrent streaming clients (<= S + W, so none should be refused),
   ``rounds`` requests each; every ``cut_every``-th request is closed by the client after
   ``cut_after`` tokens (a user who leaves mid-stream);
2. **flood**: ``flood`` non-streamed requests sent at the same moment, far beyond S + W: the
   ones beyond the bound must be refused at once with 429 + ``Retry-After``, the rest served;
3. **after**: wait until the engine is idle, then read ``/metrics``: KV blocks still referenced
   (``execstate_kv_blocks_used``) with nothing running are leaked blocks (must be 0), and
   ``/health`` must still be 200.

Reports requests served / cut / refused / errors, client-side p50/p99 TTFT and ITL of the
steady phase, the flood's refusal latency, leaked blocks and health. Exit status 1 when any
request errored, a block leaked or the server is unhealthy.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from execstate_bench.load_client import Outcome, run_clients, run_flood
from execstate_bench.machine import cpu_name, loadavg
from execstate_bench.models import resolve_bench_model
from execstate_bench.pd_client import scrape
from execstate_bench.pd_cluster import SERVED_NAME, Cluster


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(round(q * (len(ys) - 1))))]


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def _count(outs: list[Outcome]) -> dict[str, int]:
    kinds = ("served", "cut", "refused", "error")
    return {k: sum(o.kind == k for o in outs) for k in kinds}


def _wait_idle(client: Any, url: str, timeout_s: float = 120.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape(client, url)
        if m.get("execstate_num_requests_running", 0) == 0 and m.get("execstate_num_requests_waiting", 0) == 0:
            return m
        if time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def run_load_bench(
    model: str = "standard", clients: int = 12, rounds: int = 2, prompt_len: int = 128, max_tokens: int = 48,
    cut_every: int = 4, cut_after: int = 8, flood: int = 96, flood_max_tokens: int = 4, max_num_seqs: int = 8,
    max_waiting: int = 8, threads: int | None = None, seed: int = 0,
) -> dict[str, Any]:
    import os

    import httpx

    from execstate.model.config import ModelConfig

    if clients > max_num_seqs + max_waiting:
        raise ValueError(f"clients={clients} exceeds max_num_seqs + max_waiting = {max_num_seqs + max_waiting}: "
                         "the steady phase would be refused by design")
    path = resolve_bench_model(model)
    vocab = ModelConfig.from_hf_dir(path).vocab_size
    nthreads = threads or len(os.sched_getaffinity(0))
    cluster = Cluster(threads=nthreads)
    report: dict[str, Any] = {
        "workload": dict(model=str(model), clients=clients, rounds=rounds, prompt_len=prompt_len,
                         max_tokens=max_tokens, cut_every=cut_every, cut_after=cut_after, flood=flood,
                         flood_max_tokens=flood_max_tokens, max_num_seqs=max_num_seqs,
                         max_waiting_requests=max_waiting, threads=nthreads),
        "machine": {"cpu": cpu_name(), "loadavg_before": loadavg()},
    }
    try:
        url = cluster.spawn("server", ["serve", str(path), "--served-model-name", SERVED_NAME,
                                       "--enable-return-routed-experts", "--max-num-seqs", str(max_num_seqs),
                                       "--max-waiting-requests", str(max_waiting)], nthreads)
        with httpx.Client(timeout=60.0) as client:
            cluster.wait_healthy(client)
            asyncio.run(run_clients(url, _prompts(1, prompt_len, vocab, seed + 99), 4, 0, 0))  # warm-up
            steady: list[Outcome] = []
            t0 = time.perf_counter()
            for r in range(rounds):
                steady += asyncio.run(run_clients(url, _prompts(clients, prompt_len, vocab, seed + r),
                                                  max_tokens, cut_every, cut_after))
            steady_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            flooded = asyncio.run(run_flood(url, _prompts(flood, prompt_len, vocab, seed + 1000), flood_max_tokens))
            flood_s = time.perf_counter() - t0
            after = _wait_idle(client, url)
            healthy = client.get(url + "/health").status_code == 200
    finally:
        cluster.close()
    ttft = [o.ttft_s for o in steady if o.ttft_s is not None]
    itl = [x for o in steady if o.kind == "served" for x in o.itl_s]
    refused = [o for o in flooded if o.kind == "refused"]
    report.update(
        steady={**_count(steady), "seconds": round(steady_s, 3),
                "tokens": sum(o.num_tokens for o in steady),
                "ttft_p50_s": _pct(ttft, 0.5), "ttft_p99_s": _pct(ttft, 0.99),
                "itl_p50_s": _pct(itl, 0.5), "itl_p99_s": _pct(itl, 0.99)},
        flood={**_count(flooded), "seconds": round(flood_s, 3),
               "refused_with_retry_after": sum(o.retry_after is not None for o in refused)},
        after={"kv_blocks_leaked": int(after.get("execstate_kv_blocks_used", -1)),
               "running": int(after.get("execstate_num_requests_running", 0)),
               "waiting": int(after.get("execstate_num_requests_waiting", 0)), "healthy": healthy},
        errors=[o.detail for o in steady + flooded if o.kind == "error"][:5],
    )
    report["ok"] = (report["steady"]["error"] == 0 and report["flood"]["error"] == 0
                    and report["after"]["kv_blocks_leaked"] == 0 and healthy)
    return report


def format_load_report(r: dict[str, Any]) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{1000 * x:.1f} ms"

    w, s, f, a = r["workload"], r["steady"], r["flood"], r["after"]
    lines = [
        f"load bench: {w['model']}, {w['threads']} threads, max_num_seqs={w['max_num_seqs']}, "
        f"max_waiting_requests={w['max_waiting_requests']}",
        f"steady: {w['clients']} streaming clients x {w['rounds']} rounds, {w['prompt_len']}-token prompts, "
        f"{w['max_tokens']} new tokens, every {w['cut_every']}th cut after {w['cut_after']} tokens",
        f"  served {s['served']}, cut {s['cut']}, refused {s['refused']}, errors {s['error']}; "
        f"{s['tokens']} tokens in {s['seconds']:.1f} s",
        f"  TTFT p50 {ms(s['ttft_p50_s'])}, p99 {ms(s['ttft_p99_s'])}; "
        f"ITL p50 {ms(s['itl_p50_s'])}, p99 {ms(s['itl_p99_s'])}",
        f"flood: {w['flood']} requests at once ({w['flood_max_tokens']} tokens each)",
        f"  served {f['served']}, refused (429) {f['refused']} ({f['refused_with_retry_after']} with Retry-After), "
        f"errors {f['error']}; {f['seconds']:.1f} s",
        f"after: KV blocks leaked {a['kv_blocks_leaked']}, running {a['running']}, waiting {a['waiting']}, "
        f"healthy {a['healthy']}",
    ]
    if r.get("errors"):
        lines.append("errors: " + " | ".join(str(e) for e in r["errors"]))
    return "\n".join(lines)
