"""The throughput benchmark's report: per-peer figures, ratios, parity and the machine, from
what ``PeerLoop`` measured (a JSON-ready dict; ``throughput_table`` prints it).

Per peer and batch shape: the median tok/s over runs (tok/s = generated tokens / wall s) and
the *clean* median over the runs that got at least ``CLEAN_SHARE`` of their threads' CPU time
(CPU s / wall s / threads): on a shared machine, runs starved by other processes are several
times slower, and a plain median of few runs can be one of them. Token counts are checked to
be exact. Batch 1 also gives the median TTFT and, from it, the decode rate. Ratios: R3
overhead (engine R3 on / off, also paired per repeat), the engine over each peer, and each
other numerics mode over its own peer and over fp32 (``MODE_PAIRS``).
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from execstate_bench.machine import cpu_name, loadavg
from execstate_bench.numbers import median
from execstate_bench.parity import summarise
from execstate_bench.peers import EnginePeer, Peer, TransformersPeer
from execstate_bench.throughput_loop import Measured
from execstate_bench.throughput_workload import Workload

# A run is "clean" when this process got at least this share of its threads' CPU time.
CLEAN_SHARE = 0.85
STARTUP_TARGET_S = 5.0
_SHAPES = (("b8", "batch8", True), ("b1", "batch1", False))


def build_report(*, model: str | Path, path: Path, cfg: dict[str, Any], n_params: int, workload: Workload,
                 repeats: int, threads: int, peers: list[Peer], unavailable: dict[str, str],
                 measured: Measured, peers_enabled: bool, notes: list[str]) -> dict[str, Any]:
    """The report; appends the workload's and the model's notes to ``notes`` (kept by reference)."""
    wl = workload
    report_peers: dict[str, Any] = {p.name: _peer_entry(p, measured.samples[p.name], wl) for p in peers}
    for name, reason in unavailable.items():
        report_peers[name] = {"available": False, "note": reason}
    if wl.hf_batch1_max_new_tokens and wl.hf_batch1_max_new_tokens < wl.max_new_tokens and peers_enabled:
        notes.append(f"transformers batch 1 measured {wl.hf_batch1_max_new_tokens} new tokens per prompt "
                     f"(not {wl.max_new_tokens}) to keep the run short")
    is_moe = any(k in cfg for k in ("num_experts", "num_local_experts"))
    if not is_moe:
        notes.append("dense model: route return is a no-op, so the R3 on/off ratio only shows this "
                     "bench's run-to-run noise")
    startup = {p.name: p.startup_seconds[0] for p in peers if isinstance(p, EnginePeer) and p.startup_seconds}
    return {
        "model": str(model),
        "model_path": str(path),
        "architecture": (cfg.get("architectures") or ["?"])[0],
        "param_count": n_params,
        "is_moe": is_moe,
        "dtype": "float32",
        "workload": asdict(wl),
        "repeats": measured.repeats_done,
        "repeats_requested": repeats,
        "threads": threads,
        "engine_startup_seconds": startup,
        "engine_startup_target_seconds": STARTUP_TARGET_S,
        "engine_startup_ok": bool(startup) and all(v < STARTUP_TARGET_S for v in startup.values()),
        "peers": report_peers,
        "ratios": _ratios(report_peers),
        "parity": {name: {("batch8" if key == "b8" else "batch1"): summarise(c) for key, c in per_key.items()}
                   for name, per_key in measured.parity.items()},
        "prefill_pairs": measured.prefill_pairs,
        "bench_seconds": measured.bench_seconds,
        "machine": _machine(),
        "notes": notes,
    }


def _peer_entry(p: Peer, res: dict[str, list[Any]], wl: Workload) -> dict[str, Any]:
    entry: dict[str, Any] = {"label": p.label, "available": True, "parity_reference": p.parity_reference}
    for key, shape, batched in _SHAPES:
        entry[shape] = _shape_stats(res, key, wl.num_prompts_of(batched), wl.new_tokens(p, batched))
    if entry["batch8"] is not None and res.get("b8_prefill_s"):
        entry["batch8"].update(_prefill_stats(res["b8_prefill_s"], wl.num_prompts * wl.prompt_len))
    if isinstance(p, EnginePeer):
        entry["startup_seconds"] = p.startup_seconds
        entry["populate_wait_seconds"] = p.populate_wait_seconds  # the timed runs waited for prefault_kv
        entry["prefix_cache_hit_tokens"] = p.cached_tokens
        if p.routes:
            entry["routed_experts_shape_ok"] = p.route_rows_ok
    if isinstance(p, TransformersPeer):
        entry["experts_implementation"] = p.experts_implementation
    if not p.batch8:
        entry["batch8_note"] = "not measured"
    entry.update(p.report_extra())
    return entry


def _shape_stats(res: dict[str, list[Any]], key: str, n_prompts: int, n_new: int) -> dict[str, Any] | None:
    """One peer's figures for one batch shape; ``None`` when it was not measured."""
    if not res[f"{key}_s"]:
        return None
    per_run = [sum(c) for c in res[f"{key}_tok"]]
    tok_s = [n / s for n, s in zip(per_run, res[f"{key}_s"], strict=True)]
    expected = n_prompts * n_new
    b: dict[str, Any] = {
        "median_tok_s": median(tok_s),
        "clean_median_tok_s": median(
            [t for t, c in zip(tok_s, res[f"{key}_cpu_share"], strict=True) if c >= CLEAN_SHARE]),
        "clean_runs": sum(c >= CLEAN_SHARE for c in res[f"{key}_cpu_share"]),
        "best_tok_s": max(tok_s),
        "tok_s": tok_s,
        "seconds": res[f"{key}_s"],
        "tokens": per_run,
        "cpu_share": res[f"{key}_cpu_share"],
        "loadavg_1m_before": res[f"{key}_load"],
        "steal_share": res[f"{key}_steal"],
        "others_cpu_share": res[f"{key}_others"],
        "settle_seconds": res[f"{key}_settle"],
        "tokens_expected": expected,
        "tokens_exact": all(n == expected for n in per_run)
        and all(c == n_new for run in res[f"{key}_tok"] for c in run),
        "new_tokens_per_prompt": n_new,
    }
    if res[f"{key}_r3_share"]:
        b["r3_bookkeeping_share"] = median(res[f"{key}_r3_share"])
    if key == "b1" and res["b1_ttft"]:
        ttft = median(res["b1_ttft"])
        b["median_ttft_s"] = ttft
        s_per_prompt = median([s / n_prompts for s in res["b1_s"]])
        if ttft is not None and s_per_prompt and s_per_prompt > ttft:
            b["decode_tok_s"] = (n_new - 1) / (s_per_prompt - ttft)
    return b


def _prefill_stats(prefill_s: list[float], prompt_tokens: int) -> dict[str, Any]:
    """Prefill of the batch-8 runs: tok/s = prompt tokens of the batch / its time to first token."""
    med = median(prefill_s)
    return {"prefill_s": prefill_s, "median_prefill_s": med,
            "prefill_tok_s": prompt_tokens / med if med else None, "prefill_tokens": prompt_tokens}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _ratios(report_peers: dict[str, Any]) -> dict[str, Any]:
    """R3 overhead (on / off: of the medians, paired per repeat, clean runs only) and the engine
    over each peer that was measured."""

    def med(name: str, key: str, stat: str = "median_tok_s") -> float | None:
        b = report_peers.get(name, {}).get(key)
        return b[stat] if b else None

    on, off = "execstate_r3_on", "execstate_r3_off"
    ratios: dict[str, Any] = {"r3_overhead": {}}
    for key in ("batch8", "batch1"):
        rr = _ratio(med(on, key), med(off, key))
        bon, boff = report_peers[on][key], report_peers[off][key]
        paired = [a / b for a, b in zip(bon["tok_s"], boff["tok_s"], strict=True)]
        clean_pairs = [a / b for a, b, ca, cb in zip(bon["tok_s"], boff["tok_s"], bon["cpu_share"],
                                                     boff["cpu_share"], strict=True)
                       if ca >= CLEAN_SHARE and cb >= CLEAN_SHARE]
        rc = _ratio(med(on, key, "clean_median_tok_s"), med(off, key, "clean_median_tok_s"))
        ratios["r3_overhead"][key] = {
            "on_over_off": rr,
            "slowdown_pct": None if rr is None else (1.0 - rr) * 100.0,
            "paired_ratios": paired,
            "paired_median": median(paired),
            "clean_on_over_off": rc,
            "clean_slowdown_pct": None if rc is None else (1.0 - rc) * 100.0,
            "clean_paired_ratios": clean_pairs,
            # measured inside the R3-on engine (execstate.engine.r3_clock): not run-to-run noise
            "direct_pct": None if bon.get("r3_bookkeeping_share") is None else 100.0 * bon["r3_bookkeeping_share"],
        }
        for peer in ("transformers", "llama_cpp", "vllm"):
            rp = _ratio(med(off, key), med(peer, key))
            if rp is not None:
                c = "clean_median_tok_s"
                ratios.setdefault(f"engine_over_{peer}", {})[key] = {
                    "r3_off": rp, "r3_on": _ratio(med(on, key), med(peer, key)),
                    "clean_r3_off": _ratio(med(off, key, c), med(peer, key, c)),
                    "clean_r3_on": _ratio(med(on, key, c), med(peer, key, c))}
        bf16 = _ratio(med("execstate_bf16_r3_off", key), med(off, key))  # --dtype bfloat16
        if bf16 is not None:
            ratios.setdefault("bf16_over_fp32", {})[key] = {
                "r3_off": bf16, "clean_r3_off": _ratio(med("execstate_bf16_r3_off", key, "clean_median_tok_s"),
                                                       med(off, key, "clean_median_tok_s"))}
    ratios["modes"] = _mode_ratios(report_peers)
    return ratios


# (numerator, denominator) peers compared in each mode's own terms: the engine's bf16 arithmetic
# beside vLLM bf16, its GGUF mode beside llama.cpp on the same file, each mode over fp32.
MODE_PAIRS = (
    ("execstate_bf16arith_r3_off", "vllm_bf16"),
    ("execstate_gguf_r3_off", "llama_cpp_q4_1"),
    ("execstate_bf16arith_r3_off", "execstate_r3_off"),
    ("execstate_bf16arith_r3_off", "execstate_bf16_r3_off"),
    ("execstate_gguf_r3_off", "execstate_r3_off"),
    ("execstate_kvbf16_r3_off", "execstate_r3_off"),
    ("execstate_bf16arith_kvbf16_r3_off", "execstate_bf16arith_r3_off"),
    ("execstate_bf16arith_kvbf16_r3_off", "vllm_bf16"),
)
_MODE_FIGURES = (("batch8", "median_tok_s"), ("batch8", "prefill_tok_s"), ("batch1", "median_tok_s"),
                 ("batch1", "decode_tok_s"))


def _mode_ratios(report_peers: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """``"a/b"`` -> ratio per figure (batch-8 tok/s, batch-8 prefill tok/s, batch-1 tok/s, batch-1
    decode tok/s) for each pair of ``MODE_PAIRS`` that was measured."""
    out: dict[str, dict[str, float | None]] = {}
    for a, b in MODE_PAIRS:
        ea, eb = report_peers.get(a, {}), report_peers.get(b, {})
        if not (ea.get("available") and eb.get("available")):
            continue
        out[f"{a}/{b}"] = {f"{shape}.{stat}": _ratio(_figure(ea, shape, stat), _figure(eb, shape, stat))
                           for shape, stat in _MODE_FIGURES}
    return out


def _figure(entry: dict[str, Any], shape: str, stat: str) -> float | None:
    """A peer's figure; vLLM's batched prefill is kept beside its shapes (``prefill_batched_tok_s``: its
    probe is a ``max_tokens=1`` run of the batch-8 prompts, as the engine's ``prefill_tok_s``)."""
    value = (entry.get(shape) or {}).get(stat)
    if value is None and (shape, stat) == ("batch8", "prefill_tok_s"):
        value = entry.get("prefill_batched_tok_s")
    return value


def _machine() -> dict[str, Any]:
    import torch
    import transformers

    try:
        import llama_cpp as _lc

        lc_version = _lc.__version__
    except Exception:  # noqa: BLE001 - any import failure means "not installed"
        lc_version = None
    return {
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "processor": cpu_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "llama_cpp_python": lc_version,
        "loadavg_after": loadavg(),
    }
