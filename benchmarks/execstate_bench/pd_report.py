"""The PD bench's report: per-path TTFT and tok/s, ratios against the targets, transfer
figures, the PD TTFT breakdown, correctness and recovery (a JSON-ready dict; ``pd_table``
prints it).

Transfer figures are deltas of the decode instance's ``/metrics`` counters over the timed
PD requests; route bytes = ``n_moe_layers * top_k * 2`` (int16) per transferred token. The
route records travel *inside* the control bytes (manifest), so ``(route + control) / KV``
counts them twice: it is an upper bound, ``control / KV`` is the measured overhead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from execstate_bench.numbers import median
from execstate_bench.pd_client import KV_METRIC, delta

TTFT_TARGET = 1.3
OVERHEAD_TARGET = 0.02


def build_report(model: Any, path: Path, mc: Any, threads: int, startup_s: float,
                 runs: dict[str, list[dict[str, Any]]], mismatches: list[dict[str, int]], d0: dict[str, float],
                 d1: dict[str, float], recovery: dict[str, Any], sha: float,
                 workload: dict[str, Any]) -> dict[str, Any]:
    """The report from the timed runs (``timed_runs``), the decode instance's metrics before
    (``d0``) and after (``d1``) them, the failure checks and the measured sha256 rate."""
    n_pd = len(runs["pd"])
    paths: dict[str, Any] = {}
    for name, rs in runs.items():
        per_repeat = [median([x["ttft_s"] for x in rs if x["repeat"] == r]) for r in range(workload["repeats"])]
        paths[name] = {"ttft_s": [x["ttft_s"] for x in rs], "tok_s": [x["tok_s"] for x in rs],
                       "median_ttft_s": median([x["ttft_s"] for x in rs]),
                       "median_tok_s": median([x["tok_s"] for x in rs]),
                       "median_ttft_s_per_repeat": per_repeat,
                       "prefix_hit_tokens": sum(x["sources"].get("local_cache", 0) for x in rs),
                       "runs": rs}
    ts, tp = paths["single"]["median_ttft_s"], paths["pd"]["median_ttft_s"]
    paired = [b["ttft_s"] / a["ttft_s"] for a, b in zip(runs["single"], runs["pd"], strict=True)]
    ttft_ratio = tp / ts if ts and tp else None

    kv_b = delta(d1, d0, f"{KV_METRIC}_bytes_total")
    ctl_b = delta(d1, d0, f"{KV_METRIC}_control_bytes_total")
    secs = delta(d1, d0, f"{KV_METRIC}_seconds_total")
    transferred = sum(x["sources"].get("transferred", 0) for x in runs["pd"])
    route_b = transferred * mc.num_moe_layers * mc.top_k * 2
    per = (lambda v: v / n_pd) if n_pd else (lambda v: None)
    transfer = {
        "transfers": delta(d1, d0, f"{KV_METRIC}s_total"), "failures": delta(d1, d0, f"{KV_METRIC}_failures_total"),
        "kv_bytes_per_request": per(kv_b), "control_bytes_per_request": per(ctl_b),
        "route_bytes_per_request": per(route_b), "transferred_tokens_per_request": per(transferred),
        "route_bytes_per_token": mc.num_moe_layers * mc.top_k * 2,
        "kv_bytes_per_token": kv_b / transferred if transferred else None,
        "control_over_kv": ctl_b / kv_b if kv_b else None,
        "route_plus_control_over_kv": (route_b + ctl_b) / kv_b if kv_b else None,
        "overhead_target": OVERHEAD_TARGET,
        "transfer_seconds_per_request": per(secs),
        "bandwidth_bytes_per_s": kv_b / secs if secs else None,
    }
    transfer["overhead_ok"] = (transfer["route_plus_control_over_kv"] or 1.0) < OVERHEAD_TARGET

    # where PD's TTFT goes (medians of per-request server-side figures)
    pd = runs["pd"]
    breakdown = {
        "prefill_server_ttft_s": median([x["server_ttft_s"]["prefill"] for x in pd]),
        "decode_server_ttft_s": median([x["server_ttft_s"]["decode"] for x in pd]),
        "decode_transfer_s": median([x["transfer_s"] for x in pd]),
        "http_and_proxy_s": median([x["ttft_s"] - x["server_ttft_s"]["prefill"] - x["server_ttft_s"]["decode"]
                                    for x in pd]),
        "single_server_ttft_s": median([x["server_ttft_s"]["single"] for x in runs["single"]]),
        "single_http_s": median([x["ttft_s"] - x["server_ttft_s"]["single"] for x in runs["single"]]),
        "sha256_bytes_per_s": sha,
        "checksum_s_per_side_estimate": kv_b / n_pd / sha if n_pd and kv_b else None,  # per(kv_b) / sha
    }
    return {
        "model": str(model), "model_path": str(path), "architecture": mc.architecture,
        "n_moe_layers": mc.num_moe_layers, "top_k": mc.top_k, "threads": threads, "workload": workload,
        "startup_s": startup_s, "paths": paths,
        "ratios": {"ttft_pd_over_single": ttft_ratio, "ttft_paired_median": median(paired),
                   "ttft_target": TTFT_TARGET, "ttft_ok": ttft_ratio is not None and ttft_ratio <= TTFT_TARGET,
                   "tok_s_pd_over_single": (paths["pd"]["median_tok_s"] / paths["single"]["median_tok_s"]
                                            if paths["single"]["median_tok_s"] else None)},
        "transfer": transfer, "breakdown": breakdown,
        "correctness": {"compared": n_pd, "token_mismatches": len(mismatches), "mismatched": mismatches},
        "recovery": recovery,
    }
