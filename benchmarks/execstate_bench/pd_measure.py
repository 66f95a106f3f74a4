"""What the PD bench measures against the running processes: warm-up, the timed workload,
the failure and recovery checks.

Workload (docs/contracts.md 9): per repeat, ``num_prompts`` fresh prompts of ``prompt_len`` random
token ids, each sent once, streamed, one request at a time, to the single instance and to
the proxy (interleaved, the order alternating per prompt, so machine noise hits both alike;
no prompt is ever sent twice to one path, so nothing hits a prefix cache). Greedy,
``ignore_eos``, ``max_tokens`` new tokens. TTFT = request sent -> first SSE chunk carrying a
token id; throughput = generated tokens / wall time of the request. A warm-up request per path
(full length; the failing path: short) precedes the timed ones: the first prefill of a
given size allocates, and each decode side's handshake with P is cached per address.

Recovery (docs/contracts.md 9, failure recovery time): one PD request through ``proxy_fail`` (an
error response is expected), then the same request retried through the healthy proxy;
``recovery_s`` = error received -> retry fully served. The recompute check sends a fresh
prompt to the single instance and through ``proxy_recompute``: it must succeed with equal
tokens (the corrupted and later blocks are recomputed on D).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from execstate_bench.machine import loadavg_1m
from execstate_bench.parity import first_divergence
from execstate_bench.pd_client import KV_METRIC, TTFT_SUM_METRIC, Result, delta, scrape, stream_completion
from execstate_bench.pd_cluster import Cluster


def warm_up(client: Any, cluster: Cluster, names: list[str], prompt: list[int]) -> None:
    """One 2-token request of ``prompt`` per path (first allocations, each D's handshake with P).
    ``proxy_fail`` must fail (every load there is corrupted), every other path must succeed."""
    for name in names:
        w = stream_completion(client, cluster.procs[name].url, prompt, 2)
        if w.ok == (name == "proxy_fail"):
            raise RuntimeError(f"warm-up request to {name}: ok={w.ok}, error {w.error}")


def sha256_bytes_per_s(nbytes: int = 32 << 20) -> float:
    """sha256 rate of this process (to estimate the transfer checksums' share of the TTFT)."""
    import hashlib

    buf = np.ones(nbytes, dtype=np.uint8)
    t0 = time.perf_counter()
    hashlib.sha256(buf.data).digest()
    return nbytes / (time.perf_counter() - t0)


def timed_runs(client: Any, cluster: Cluster, prompt_sets: list[list[list[int]]], max_tokens: int
               ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, int]]]:
    """Each prompt to the single instance and through the proxy, the order alternating per prompt.
    Returns the runs per path (``single``, ``pd``) and the prompts whose tokens differ."""
    procs = cluster.procs
    runs: dict[str, list[dict[str, Any]]] = {"single": [], "pd": []}
    mismatches: list[dict[str, int]] = []
    for r, prompts in enumerate(prompt_sets):
        for i, ids in enumerate(prompts):
            order = ["single", "pd"] if i % 2 == 0 else ["pd", "single"]
            got: dict[str, Result] = {}
            for name in order:
                servers = ["single"] if name == "single" else ["prefill", "decode", "proxy"]
                m0 = {n: scrape(client, procs[n].url) for n in servers if n != "proxy"}
                cpu0 = {n: procs[n].cpu_seconds() for n in servers}
                load = loadavg_1m()
                url = procs["single" if name == "single" else "proxy"].url
                res = got[name] = stream_completion(client, url, ids, max_tokens)
                cpu = {n: round(procs[n].cpu_seconds() - cpu0[n], 3) for n in servers}
                m1 = {n: scrape(client, procs[n].url) for n in m0}
                if not res.ok:
                    raise RuntimeError(f"{name} request failed (repeat {r}, prompt {i}): {res.error}")
                run = {"repeat": r, "prompt": i, "ttft_s": res.ttft_s, "seconds": res.seconds,
                       "tok_s": res.tok_s, "tokens": len(res.token_ids),
                       "sources": (res.usage or {}).get("prompt_token_sources") or {},
                       "server_ttft_s": {n: delta(m1[n], m0[n], TTFT_SUM_METRIC) for n in m1},
                       "cpu_s": cpu, "loadavg_1m_before": load}
                if name == "pd":
                    run["transfer_s"] = delta(m1["decode"], m0["decode"], f"{KV_METRIC}_seconds_total")
                runs[name].append(run)
            first = first_divergence(got["single"].token_ids, got["pd"].token_ids)
            if first is not None:
                mismatches.append({"repeat": r, "prompt": i, "first_divergence": first})
    return runs, mismatches


def failure_and_recovery(client: Any, cluster: Cluster, ids: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """The injected-failure checks (policy ``fail``: detection and recovery; ``recompute``:
    served with the single instance's tokens) on two fresh prompts."""
    procs = cluster.procs
    url = {n: p.url for n, p in procs.items()}
    f0 = scrape(client, url["decode_fail"])
    t_send = time.perf_counter()
    bad = stream_completion(client, url["proxy_fail"], ids[0], max_tokens)
    retry = stream_completion(client, url["proxy"], ids[0], max_tokens)  # the client retries, healthy path
    f1 = scrape(client, url["decode_fail"])
    healthy_after = client.get(url["decode_fail"] + "/health").status_code == 200
    out: dict[str, Any] = {
        "failure": {"error_detected": not bad.ok, "status": bad.status, "error": bad.error,
                    "detect_s": bad.t_end - t_send, "tokens_before_error": len(bad.token_ids),
                    "decode_transfer_failures": delta(f1, f0, f"{KV_METRIC}_failures_total"),
                    "faulty_decode_healthy_after": healthy_after},
        "retry_ok": retry.ok,
        "retry_prompt_token_sources": (retry.usage or {}).get("prompt_token_sources"),
        "recovery_s": retry.t_end - bad.t_end if retry.ok else None,
        "recovery_first_token_s": retry.t_first - bad.t_end if retry.ok and retry.t_first else None,
        "injection_to_served_s": retry.t_end - t_send if retry.ok else None,
    }
    r0 = scrape(client, url["decode_recompute"])
    ref = stream_completion(client, url["single"], ids[1], max_tokens)
    rec = stream_completion(client, url["proxy_recompute"], ids[1], max_tokens)
    r1 = scrape(client, url["decode_recompute"])
    out["recompute"] = {
        "ok": rec.ok, "error": rec.error, "ttft_s": rec.ttft_s, "single_ttft_s": ref.ttft_s,
        "tokens_equal_single": rec.ok and ref.ok and rec.token_ids == ref.token_ids,
        "prompt_token_sources": (rec.usage or {}).get("prompt_token_sources"),
        "decode_transfer_failures": delta(r1, r0, f"{KV_METRIC}_failures_total"),
    }
    return out
