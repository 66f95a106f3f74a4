"""``execstate bench throughput --sweep 1,2,4,8,16``: decode tok/s against batch size, for each
peer present, next to the memory-bandwidth roofline (``throughput_roofline``).

Peers: the engine (R3 off), transformers, llama.cpp (batch 1 only, and only where the main
benchmark runs it) and vLLM (where its python is given), built as in ``throughput``. All are
loaded once and warmed up; then per repeat, per batch size ``B``, every peer (in an order that
rotates with ``B`` and the repeat) runs

1. a prefill probe: ``B`` fresh prompts, ``max_tokens=1`` -> ``prefill_s`` (time to first token);
2. the timed run: ``B`` other fresh prompts, ``max_new_tokens`` each -> ``total_s``,

all ``B`` prompts in one call (``B = 1``: one prompt, unbatched), after a read-bandwidth probe
(``ADJACENT_PROBE_MIB`` summed; unless a bandwidth is given). Decode tok/s =
``B x (max_new_tokens - 1) / (total_s - prefill_s)``: the tokens after the first over the time
after the first (prefill cost estimated from the probe's equally long prompts). Fresh prompts
everywhere, so no prefix cache hits. Medians over repeats; the timed runs' greedy tokens are
compared with the engine's (``parity``). The report (JSON-ready) carries the roofline at each
``B`` and each peer's share of it; ``throughput_plot`` draws it. The roofline at ``B`` uses the
median of the bandwidth probes taken next to ``B``'s runs: this shared VM's memory bandwidth
moves by tens of percent within minutes (one run measured 44.6 GB/s at its start, the next
73.4), so a single figure from the start of the sweep made the share of the roofline a
matter of timing. The start-of-sweep measure (every thread count) is kept in the report.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from execstate_bench.machine import loadavg_1m, settle
from execstate_bench.numbers import fmt, median
from execstate_bench.parity import add_counts, compare, summarise
from execstate_bench.peers import EnginePeer, Peer
from execstate_bench.throughput_roofline import measure_bandwidth, roofline

MAX_BATCH = 64  # the engine peer's (and vLLM peer's) max_num_seqs
ADJACENT_PROBE_MIB = 256  # the read-bandwidth probe before each batch size's runs (best of 3)
WARMUP_NEW_TOKENS = 4
REFERENCE = "execstate_r3_off"


@dataclass(frozen=True)
class SweepWorkload:
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    prompt_len: int = 256
    max_new_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.batches or any(b < 1 or b > MAX_BATCH for b in self.batches):
            raise ValueError(f"batch sizes must be in 1..{MAX_BATCH}, got {list(self.batches)}")
        if self.prompt_len < 1 or self.max_new_tokens < 2:
            raise ValueError("need prompt_len >= 1 and max_new_tokens >= 2 (decode = tokens after the first)")

    def prompts(self, vocab_size: int, batch: int, repeat: int, kind: str) -> list[list[int]]:
        """Fresh prompts for (batch, repeat, kind); kind is 'prefill', 'full' or 'warmup'."""
        tag = {"prefill": 10, "full": 11, "warmup": 12}[kind]
        rng = np.random.default_rng([self.seed, tag, batch, repeat])
        return rng.integers(0, vocab_size, size=(batch, self.prompt_len)).tolist()


def parse_batches(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)`` (sorted, unique); ``ValueError`` naming what is wrong."""
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--sweep wants comma-separated batch sizes like 1,2,4,8,16, got {text!r}") from None
    if not out:
        raise ValueError("--sweep needs at least one batch size")
    return tuple(out)


def run_throughput_sweep(model: str | Path = "standard", workload: SweepWorkload | None = None,
                         repeats: int = 1, num_threads: int | None = None, peers: bool = True,
                         llama_cpp: bool = True, vllm_python: str | None = None,
                         bandwidth_gb_s: float | None = None, print_table: bool = True, dtype: str = "float32",
                         quantization: str | None = None, kv_cache_dtype: str = "auto") -> dict[str, Any]:
    """Run the sweep and return its report. ``bandwidth_gb_s``: use this memory bandwidth for the
    roofline instead of measuring it (e.g. one measured on a quiet machine). ``dtype``,
    ``quantization``: the other numerics modes and their peers, as in ``run_throughput_bench``;
    each peer's share of the roofline is then of its own storage's roofline (bf16: 2 bytes a
    weight; GGUF: the file's bytes)."""
    import torch

    from execstate_bench.models import count_parameters, resolve_bench_model
    from execstate_bench.throughput import _peers, mode_peers
    from execstate_bench.throughput_report import _machine
    from execstate_bench.throughput_workload import Workload
    from execstate_bench.vllm_peer import add_vllm_peer

    wl = workload or SweepWorkload()
    threads = int(num_threads or os.cpu_count() or 1)
    torch.set_num_threads(threads)
    path = resolve_bench_model(model)
    cfg = json.loads((path / "config.json").read_text())
    notes: list[str] = []
    if bandwidth_gb_s is None:
        bw = measure_bandwidth(threads=threads)
        bandwidth = {"source": "measured", "read_gb_s": bw["read"] / 1e9, "copy_gb_s": bw["copy"] / 1e9,
                     "by_threads_gb_s": {t: {k: v / 1e9 for k, v in d.items()} for t, d in bw["by_threads"].items()},
                     "size_mib": bw["size_mib"], "loadavg_1m_before": loadavg_1m()}
    else:
        bandwidth = {"source": "given (--bandwidth-gbs)", "read_gb_s": float(bandwidth_gb_s)}
    # the main bench's peer set, less the R3-on engine (route return is measured there); every
    # peer's prefill is this sweep's own probe run (_one), so none probes inside its runs
    big = Workload(wl.prompt_len, wl.max_new_tokens, max(wl.batches), 1, None, wl.seed)
    peer_list, unavailable = _peers(model, path, big, threads, peers, llama_cpp, notes, probe_prefill=False)
    peer_list = [p for p in peer_list if p.name != "execstate_r3_on"]
    peer_list[1:1] = mode_peers(model, path, big, threads, dtype, quantization, peers and llama_cpp, unavailable,
                                probe_prefill=False, kv_cache_dtype=kv_cache_dtype)
    if peers:
        add_vllm_peer(peer_list, unavailable, vllm_python, path, big, threads, probe_prefill=False)
        if dtype == "bfloat16":
            add_vllm_peer(peer_list, unavailable, vllm_python, path, big, threads, probe_prefill=False,
                          dtype="bfloat16")
    else:
        unavailable["vllm"] = "peers disabled (--no-peers)"
    for p in peer_list:  # the parity of this sweep is against the fp32 engine or the peer's own mode
        if p.parity_reference == "execstate_r3_on":
            p.parity_reference = REFERENCE
    t0 = time.perf_counter()
    samples, parity, adjacent = _measure(peer_list, wl, int(cfg["vocab_size"]), repeats, threads,
                                         probe_bandwidth=bandwidth_gb_s is None)
    if adjacent:
        bandwidth["next_to_runs_gb_s"] = {str(b): [v / 1e9 for v in vs] for b, vs in adjacent.items()}
        bandwidth["source"] = "measured next to each batch size's runs, median"
        per_batch: float | dict[int, float] = {b: float(np.median(vs)) for b, vs in adjacent.items()}
    else:
        per_batch = bandwidth["read_gb_s"] * 1e9
    report = {
        "model": str(model), "model_path": str(path), "architecture": (cfg.get("architectures") or ["?"])[0],
        "param_count": count_parameters(path), "dtype": "float32", "threads": threads,
        "workload": asdict(wl), "repeats": repeats, "bandwidth": bandwidth,
        "roofline": roofline(path, list(wl.batches), per_batch),
        "roofline_by_storage": _storage_rooflines(model, path, peer_list, list(wl.batches), per_batch),
        "peers": {p.name: _peer_entry(p, samples[p.name], wl) for p in peer_list},
        "parity_vs_engine": {name: {b: summarise(c) for b, c in per.items()} for name, per in parity.items()},
        "sweep_seconds": time.perf_counter() - t0, "machine": _machine(), "notes": notes,
    }
    for name, why in unavailable.items():
        report["peers"][name] = {"available": False, "note": why}
    _add_fractions(report)
    _note_starved(report)
    if print_table:
        from execstate_bench.throughput_plot import format_sweep_table

        print(format_sweep_table(report))
    return report


def _measure(peer_list: list[Peer], wl: SweepWorkload, vocab: int, repeats: int, threads: int,
             probe_bandwidth: bool = True) -> tuple[dict[str, dict[str, list[dict[str, Any]]]],
                                                   dict[str, dict[str, dict[str, Any]]], dict[int, list[float]]]:
    """Samples per peer and batch, greedy parity, and (``probe_bandwidth``) the read bandwidth
    in bytes/s measured before each batch size's runs, per batch size."""
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {p.name: {} for p in peer_list}
    parity: dict[str, dict[str, dict[str, Any]]] = {}
    adjacent: dict[int, list[float]] = {}
    try:
        for p in peer_list:
            p.load()
            warm = wl.prompts(vocab, min(2, max(wl.batches)), 0, "warmup")  # a batched peer holds max(batches)
            if p.batch8:
                p.run(warm, WARMUP_NEW_TOKENS, batched=True)
            p.run(warm[:1], WARMUP_NEW_TOKENS, batched=False)
            p.after_warmup()
        for r in range(repeats):
            for i, b in enumerate(wl.batches):
                runnable = [p for p in peer_list if b == 1 or p.batch8]
                if probe_bandwidth and runnable:
                    settle()
                    bw = measure_bandwidth(size_mib=ADJACENT_PROBE_MIB, repeats=3, threads=threads)
                    adjacent.setdefault(b, []).append(bw["read"])
                k = (i + r) % len(runnable) if runnable else 0
                tokens: dict[str, list[list[int]]] = {}
                for p in runnable[k:] + runnable[:k]:
                    s, tokens[p.name] = _one(p, wl, vocab, b, r, threads)
                    samples[p.name].setdefault(str(b), []).append(s)
                    print(f"sweep: repeat {r + 1}/{repeats}, batch {b}, {p.name}: decode "
                          f"{fmt(s['decode_tok_s'], '.1f')} tok/s, prefill {s['prefill_s']:.2f} s, "
                          f"run {s['total_s']:.2f} s", file=sys.stderr, flush=True)
                ref_of = {p.name: p.parity_reference for p in runnable}
                for name, ids in tokens.items():
                    ref = tokens.get(ref_of.get(name, REFERENCE))
                    if ref is not None and name != REFERENCE:
                        add_counts(parity.setdefault(name, {}).setdefault(str(b), {}), compare(ref, ids))
    finally:
        for p in peer_list:
            p.close()
    return samples, parity, adjacent


def _one(
    p: Peer, wl: SweepWorkload, vocab: int, b: int, r: int, threads: int
) -> tuple[dict[str, Any], list[list[int]]]:
    """One prefill probe and one timed run of ``p`` at batch ``b``."""
    batched = b > 1
    settle()
    load = loadavg_1m()
    pre = p.run(wl.prompts(vocab, b, r, "prefill"), 1, batched)
    settle()
    cpu0, team0 = time.process_time(), p.team_calls()
    full = p.run(wl.prompts(vocab, b, r, "full"), wl.max_new_tokens, batched)
    cpu = full.cpu_seconds if full.cpu_seconds is not None else time.process_time() - cpu0
    team1 = p.team_calls()
    calls = team1[0] - team0[0] if team0 is not None and team1 is not None else 0
    solo_share = (team1[1] - team0[1]) / calls if calls > 0 and team0 is not None and team1 is not None else None
    decode_s = full.seconds - pre.seconds
    return {
        "prefill_s": pre.seconds, "total_s": full.seconds,
        "decode_tok_s": b * (wl.max_new_tokens - 1) / decode_s if decode_s > 0 else None,
        "tokens_exact": [len(t) for t in full.token_ids] == [wl.max_new_tokens] * b
        and [len(t) for t in pre.token_ids] == [1] * b,
        "cpu_share": cpu / (full.seconds * p.threads_in_use(threads)), "loadavg_1m_before": load,
        "team_solo_share": solo_share,
    }, full.token_ids


def _peer_entry(p: Peer, runs: dict[str, list[dict[str, Any]]], wl: SweepWorkload) -> dict[str, Any]:
    by_batch: dict[str, Any] = {}
    for b, rs in runs.items():
        n = int(b)
        by_batch[b] = {
            "decode_tok_s": median([x["decode_tok_s"] for x in rs]),
            "decode_tok_s_runs": [x["decode_tok_s"] for x in rs],
            "total_tok_s": median([n * wl.max_new_tokens / x["total_s"] for x in rs]),
            "prefill_tok_s": median([n * wl.prompt_len / x["prefill_s"] for x in rs]),
            "prefill_s": [x["prefill_s"] for x in rs], "total_s": [x["total_s"] for x in rs],
            "cpu_share": [x["cpu_share"] for x in rs], "loadavg_1m_before": [x["loadavg_1m_before"] for x in rs],
            # the share of the timed run's layer calls the kernel team governor ran on one thread
            # (None: no governor, or a one-thread team); a low cpu_share with a high one is the
            # governor's choice, with a low one the machine's
            "team_solo_share": [x["team_solo_share"] for x in rs],
            "tokens_exact": all(x["tokens_exact"] for x in rs),
        }
    entry: dict[str, Any] = {"label": p.label, "available": True, "by_batch": by_batch, "storage": p.storage,
                             "parity_reference": p.parity_reference}
    if isinstance(p, EnginePeer):
        entry["startup_seconds"] = p.startup_seconds
    entry.update({k: v for k, v in p.report_extra().items() if k in ("startup_seconds", "settings")})
    return entry


def _note_starved(report: dict[str, Any]) -> None:
    """A note when a peer's median CPU share is below ``CLEAN_SHARE`` (its runs waited for CPU)."""
    from execstate_bench.throughput_report import CLEAN_SHARE

    shares = {n: median([c for x in e["by_batch"].values() for c in x["cpu_share"]])
              for n, e in report["peers"].items() if e.get("by_batch")}
    starved = {n: s for n, s in shares.items() if s is not None and s < CLEAN_SHARE}
    report["median_cpu_share"] = shares
    if starved:
        report["notes"].append(
            "busy machine: median CPU share (CPU s / (wall s x threads)) below " f"{CLEAN_SHARE} for "
            + ", ".join(f"{n} {s:.2f}" for n, s in starved.items())
            + "; these runs waited for CPU and their tok/s are not what the code does on a quiet machine")


def _storage_rooflines(model: str | Path, path: Path, peer_list: list[Peer], batches: list[int],
                       per_batch: float | dict[int, float]) -> dict[str, Any]:
    """The roofline of each storage other than fp32 that a peer uses (bf16: 2 bytes a weight;
    gguf: the bytes of the GGUF file the engine's GGUF peer serves)."""
    from execstate.model.gguf_model import gguf_file
    from execstate_bench.throughput import gguf_build_path
    from execstate_bench.throughput_roofline import gguf_weight_bytes

    out: dict[str, Any] = {}
    for storage in sorted({p.storage for p in peer_list} - {"fp32"}):
        if storage == "bf16":
            out[storage] = roofline(path, batches, per_batch, bytes_per_weight=2)
        else:
            gpath = gguf_build_path(model)
            out[storage] = roofline(path, batches, per_batch, weights=gguf_weight_bytes(gguf_file(gpath), gpath))
    return out


def _add_fractions(report: dict[str, Any]) -> None:
    """Each available peer's decode tok/s over its storage's roofline ceiling at each batch size."""
    for e in report["peers"].values():
        roof = report.get("roofline_by_storage", {}).get(e.get("storage"), report["roofline"])["by_batch"]
        for b, x in e.get("by_batch", {}).items():
            c = roof[b]["ceiling_tok_s"]
            x["fraction_of_roofline"] = x["decode_tok_s"] / c if x["decode_tok_s"] and c else None


def sweep_main(args: Any) -> int:
    """``execstate bench throughput --sweep ...``: run, print, and write ``--out``/``--plot``."""
    wl = SweepWorkload(parse_batches(args.sweep), args.sweep_prompt_len, args.sweep_max_tokens)
    report = run_throughput_sweep(model=args.model, workload=wl, repeats=args.repeats, num_threads=args.threads,
                                  peers=not args.no_peers, vllm_python=args.vllm_python,
                                  bandwidth_gb_s=args.bandwidth_gbs, print_table=not args.json,
                                  dtype=getattr(args, "dtype", "float32"),
                                  quantization=getattr(args, "quantization", None),
                                  kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        from execstate_bench.throughput_plot import plot_sweep

        plot_sweep(report, Path(args.plot))
    if args.json:
        print(json.dumps(report, indent=2))
    return 0
