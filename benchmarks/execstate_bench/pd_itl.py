"""``execstate bench pd --itl-under-loads``: does a KV load stall the decode instance's other streams?

docs/contracts.md 8: transfers complete off the engine thread. Measured here as the inter-token latency
(ITL) of one running stream on the decode instance (D) while PD loads of ``prompt_len``-token
prompts happen on D, against the same stream while no load happens.

Processes (``pd_cluster``; the handoff secret reaches all of them through the environment): a
prefill instance (P, export TTL 600 s) and D, no proxy. This client plays the proxy: it first
has P prefill and export ``num_loads`` fresh prompts and keeps their signed handoffs, so that P
computes nothing while ITL is measured (on a shared machine P's prefill would otherwise take
D's CPU and hide what the load itself costs).

Then one long greedy stream runs on D, and ``num_loads`` rounds alternate on it: a quiet window
of ``quiet_tokens`` tokens, then one handoff sent to D (``max_tokens=1``: D loads the KV,
verifies it, computes the last prompt token; the window lasts until D answered). Alternating
the two conditions within one stream spreads the machine's noise (other tenants) over both.
ITL = gap between consecutive tokens as this client receives them (a chunk of k tokens counts
as k gaps of gap/k); a gap overlapping a load window counts as "during loads", a gap inside a
quiet window as "without". Reported: p50 / p99 / max of each, the ratio p99(during) /
p99(without) (target <= 1.2), the largest gaps, D's server-side transfer time (``/metrics``)
and the machine's load average.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from execstate_bench.machine import loadavg
from execstate_bench.models import STANDARD, resolve_bench_model
from execstate_bench.pd_client import KV_METRIC, delta, scrape
from execstate_bench.pd_cluster import SERVED_NAME, Cluster, kv_config


def _stream(client: Any, url: str, prompt: list[int], max_tokens: int, stop: threading.Event | None = None,
            arrivals: list[tuple[float, int]] | None = None) -> list[tuple[float, int]]:
    """Token arrival times ``(perf_counter, num_tokens)`` of one streamed greedy completion,
    appended to ``arrivals`` as they come; stops reading (which aborts the request) once
    ``stop`` is set."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "stream": True}
    arrivals = [] if arrivals is None else arrivals
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"stream failed: {r.status_code} {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            n = sum(len(c.get("token_ids") or []) for c in json.loads(line[6:]).get("choices") or [])
            if n:
                arrivals.append((time.perf_counter(), n))
            if stop is not None and stop.is_set():
                break
    return arrivals


def _gaps(arrivals: list[tuple[float, int]]) -> list[tuple[float, float, float]]:
    """``(start, end, itl)`` per token gap (a chunk of k tokens: k gaps of gap/k)."""
    out = []
    for (t0, _), (t1, n) in zip(arrivals, arrivals[1:], strict=False):
        out += [(t0, t1, (t1 - t0) / n)] * n
    return out


def _summary(itls: list[float]) -> dict[str, Any]:
    if not itls:
        return {"n": 0}
    a = np.asarray(itls) * 1e3
    return {"n": len(itls), "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "max_ms": round(float(a.max()), 3)}


def run_itl_under_loads(
    model: str | Path = STANDARD,
    prompt_len: int = 2048,
    num_loads: int = 6,
    quiet_tokens: int = 40,
    *,
    threads: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    import httpx

    from execstate.model.config import ModelConfig

    t_bench = time.perf_counter()
    threads = int(threads or os.cpu_count() or 1)
    path = resolve_bench_model(model)
    mc = ModelConfig.from_hf_dir(path)
    rng = np.random.default_rng([seed, prompt_len, 77])
    prompts = rng.integers(3, mc.vocab_size, (num_loads + 1, prompt_len)).tolist()
    stream_prompt = rng.integers(3, mc.vocab_size, 64).tolist()
    load_before = loadavg()
    cluster = Cluster(threads)
    client = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0))
    stream_client = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0))  # its own pool: another thread
    try:
        p = cluster.serve("prefill", path, kv_config("kv_producer", ttl_s=600.0))
        d = cluster.serve("decode", path, kv_config("kv_consumer"))
        cluster.wait_healthy(client)

        def export(ids: list[int]) -> dict[str, Any]:
            body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0,
                    "kv_transfer_params": {"do_remote_decode": True}}
            r = client.post(p + "/v1/completions", json=body)
            r.raise_for_status()
            return r.json()["kv_transfer_params"]

        def load(ids: list[int], kv: dict[str, Any]) -> None:
            body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0, "kv_transfer_params": kv}
            r = client.post(d + "/v1/completions", json=body)
            if r.status_code != 200 or r.json()["usage"]["prompt_token_sources"]["transferred"] == 0:
                raise RuntimeError(f"PD load failed: {r.status_code} {r.text[:300]}")

        load(prompts[0], export(prompts[0]))  # warm-up: handshake, first allocations
        _stream(client, d, stream_prompt, 32)
        handoffs = [export(ids) for ids in prompts[1:]]

        arrivals: list[tuple[float, int]] = []
        stop = threading.Event()
        longest = mc.max_position_embeddings - len(stream_prompt) - 1
        reader = threading.Thread(target=_stream, args=(stream_client, d, stream_prompt, longest, stop, arrivals))
        m0 = scrape(client, d)
        reader.start()

        def wait_tokens(n: int) -> float:
            t = time.perf_counter()
            while sum(k for at, k in list(arrivals) if at > t) < n:
                if not reader.is_alive():
                    raise RuntimeError("the stream on D ended early")
                time.sleep(0.002)
            return time.perf_counter()

        wait_tokens(8)  # the stream is decoding
        quiet: list[tuple[float, float]] = []
        busy: list[tuple[float, float]] = []
        for ids, kv in zip(prompts[1:], handoffs, strict=True):
            t0 = time.perf_counter()
            quiet.append((t0, wait_tokens(quiet_tokens)))
            t1 = time.perf_counter()
            load(ids, kv)
            busy.append((t1, time.perf_counter()))
        quiet.append((time.perf_counter(), wait_tokens(quiet_tokens)))
        stop.set()
        reader.join(60)
        m1 = scrape(client, d)
    finally:
        client.close()
        stream_client.close()
        cluster.close()
    gaps = _gaps(arrivals)
    during = [g for s, e, g in gaps if any(e > a and s < b for a, b in busy)]
    without = [g for s, e, g in gaps if any(s >= a and e <= b for a, b in quiet)]
    phases = {"without_loads": _summary(without), "during_loads": _summary(during)}
    base_p99 = phases["without_loads"]["p99_ms"]
    phases["during_loads"]["largest_ms"] = sorted((round(g * 1e3, 1) for g in during), reverse=True)[:8]
    phases["during_loads"]["over_p99_without"] = sum(g * 1e3 > base_p99 for g in during)
    phases["without_loads"]["largest_ms"] = sorted((round(g * 1e3, 1) for g in without), reverse=True)[:8]
    return {
        "model": str(model), "threads": threads,
        "workload": {"prompt_len": prompt_len, "num_loads": num_loads, "quiet_tokens": quiet_tokens, "seed": seed},
        "phases": phases,
        "load_windows_s": [round(b - a, 3) for a, b in busy],
        "loads_transfer_s": round(delta(m1, m0, f"{KV_METRIC}_seconds_total"), 4),
        "loads_transferred": delta(m1, m0, f"{KV_METRIC}s_total"),
        "p99_during_loads_over_without": round(phases["during_loads"]["p99_ms"] / base_p99, 3),
        "target": 1.2,
        "machine": {"cpu_count": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": loadavg()},
        "bench_seconds": round(time.perf_counter() - t_bench, 1),
    }


def format_itl_table(r: dict[str, Any]) -> str:
    w = r["workload"]
    lines = [f"ITL of a running stream on D, {w['num_loads']} PD loads of {w['prompt_len']}-token prompts "
             f"alternating with quiet windows of {w['quiet_tokens']} tokens ({r['model']}, {r['threads']} threads "
             "per engine)",
             f"{'':<15} {'gaps':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  largest ms"]
    for name, s in r["phases"].items():
        lines.append(f"{name:<15} {s.get('n', 0):>6} {s.get('p50_ms', float('nan')):>8} "
                     f"{s.get('p99_ms', float('nan')):>8} {s.get('max_ms', float('nan')):>8}  {s.get('largest_ms')}")
    d = r["phases"]["during_loads"]
    lines.append(f"p99 during loads / p99 without: {r['p99_during_loads_over_without']} (target <= {r['target']}); "
                 f"{d.get('over_p99_without')} of {d.get('n')} gaps during loads above the p99 without")
    lines.append(f"load windows (s): {r['load_windows_s']}; D's transfer time {r['loads_transfer_s']} s for "
                 f"{r['loads_transferred']:.0f} loads; load average before {r['machine']['loadavg_before']}, "
                 f"after {r['machine']['loadavg_after']}")
    return "\n".join(lines)
