"""``execstate bench throughput``: the engine against its peers on one fixed workload.

Workload (DESIGN.md 8, throughput = generated tokens / wall seconds): ``num_prompts``
prompts of ``prompt_len`` random valid token ids, ``max_new_tokens`` new tokens each,
greedy, ``ignore_eos``.

- batch 8: all ``num_prompts`` prompts in one call;
- batch 1: ``batch1_prompts`` of them one at a time (wall time includes each prefill).

Peers, run side by side in one process and interleaved per repeat (every peer runs
repeat r before any peer runs repeat r+1; the peer order rotates every repeat, so no peer
always runs first or right after another), so machine noise hits them alike:

1. ``execstate_r3_on``  — the engine with route return on;
2. ``execstate_r3_off`` — the engine with route return off (R3 overhead = on / off);
3. ``transformers``     — ``AutoModelForCausalLM.generate`` on the same fp32 weights;
4. ``llama_cpp``        — llama-cpp-python on an F32 GGUF of the same dequantised weights,
   only for the dense ``smollm2-135m`` and only when ``llama_cpp`` is importable.

Every repeat draws fresh prompts (batch 8 and batch 1 draw separate sets), so the prefix
cache never hits across repeats or between the two batch shapes; a short warm-up per peer
precedes the timed runs. Each peer's generated token counts are checked to be exact, and
the greedy tokens of the peers are compared with the engine's (``parity``).
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import platform
import shutil
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from execstate.bench.peers import EnginePeer, LlamaCppPeer, Peer, TransformersPeer

STANDARD = "standard"
STANDARD_DIRNAME = "standard-moe"
STANDARD_SEED = 0
LLAMA_CPP_MODEL = "smollm2-135m"
STARTUP_TARGET_S = 5.0
# Above this many bytes of fp32 weights held at once, peers are loaded one at a time.
RESIDENT_BUDGET_BYTES = 6 << 30
WARMUP_NEW_TOKENS = 4
# A run is "clean" when this process got at least this share of its threads' CPU time
# (CPU s / wall s / threads): on a shared machine, runs starved by other processes are
# several times slower, and a plain median of few runs can be one of them.
CLEAN_SHARE = 0.85


@dataclass(frozen=True)
class Workload:
    prompt_len: int = 256
    max_new_tokens: int = 128
    num_prompts: int = 8
    batch1_prompts: int = 2
    # transformers at batch 1 may be asked for fewer tokens when it is very slow (noted)
    hf_batch1_max_new_tokens: int | None = None
    seed: int = 0

    def prompts(self, vocab_size: int, repeat: int, kind: str) -> list[list[int]]:
        """Fresh prompts for (repeat, kind); kind is 'b8', 'b1' or 'warmup'."""
        n = {"b8": self.num_prompts, "b1": self.batch1_prompts, "warmup": self.num_prompts}[kind]
        tag = {"b8": 0, "b1": 1, "warmup": 2}[kind]
        rng = np.random.default_rng([self.seed, tag, repeat])
        return rng.integers(0, vocab_size, size=(n, self.prompt_len)).tolist()


# ---------------------------------------------------------------------------------------
# model resolution


def standard_model_dir() -> Path:
    try:
        from execstate.paths import model_dir

        return model_dir(STANDARD_DIRNAME)
    except ImportError:  # pragma: no cover - paths.py exists in this tree
        return Path.home() / ".cache" / "execstate" / "models" / STANDARD_DIRNAME


def ensure_standard_model() -> Path:
    """Build the standard benchmark model into the user cache once (atomic rename)."""
    out = standard_model_dir()
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    from execstate.model.random_models import make_standard_moe

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    make_standard_moe(tmp, seed=STANDARD_SEED)
    if out.exists():  # built concurrently by someone else
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    os.replace(tmp, out)
    return out


def resolve_bench_model(model: str | Path) -> Path:
    if str(model) == STANDARD:
        return ensure_standard_model()
    p = Path(model).expanduser()
    if p.is_dir():
        return p
    from execstate.model.registry import resolve_model

    return Path(resolve_model(str(model)))


def count_parameters(model_dir: Path) -> int:
    """Number of stored weights (tied tensors once) from the safetensors headers."""
    from safetensors import safe_open

    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                total += int(np.prod(sf.get_slice(name).get_shape()))
    return total


# ---------------------------------------------------------------------------------------
# the benchmark


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else None


def _compare(ref: list[list[int]], other: list[list[int]]) -> dict[str, int]:
    """Position-wise greedy token agreement over the common length of each pair."""
    total = same = seq_same = 0
    first_div: list[int] = []
    for a, b in zip(ref, other, strict=True):
        n = min(len(a), len(b))
        eq = [x == y for x, y in zip(a[:n], b[:n], strict=True)]
        total += n
        same += sum(eq)
        seq_same += all(eq)
        if not all(eq):
            first_div.append(eq.index(False))
    return {"tokens": total, "identical": same, "sequences": len(ref), "sequences_identical": seq_same,
            "first_divergence": min(first_div) if first_div else -1}


def _add_counts(acc: dict[str, int], c: dict[str, int]) -> None:
    for k, v in c.items():
        if k == "first_divergence":
            if v >= 0:
                acc[k] = v if acc.get(k, -1) < 0 else min(acc[k], v)
            else:
                acc.setdefault(k, -1)
        else:
            acc[k] = acc.get(k, 0) + v


def run_throughput_bench(
    model: str | Path = STANDARD,
    repeats: int = 3,
    peers: bool = True,
    num_threads: int | None = None,
    *,
    prompt_len: int = 256,
    max_new_tokens: int = 128,
    num_prompts: int = 8,
    batch1_prompts: int = 2,
    hf_batch1_max_new_tokens: int | None = None,
    seed: int = 0,
    llama_cpp: bool = True,
    print_table: bool = True,
    time_budget_s: float | None = 600.0,
) -> dict[str, Any]:
    """Run the benchmark and return its report (also printed as a table).

    ``time_budget_s``: after each repeat, stop early (noted in the report) when one more
    repeat at the pace so far would end past this many seconds from the start (loading
    and warm-up included); the workload itself is never cut, so peers stay comparable.
    """
    import torch
    import transformers

    t_start = time.perf_counter()
    threads = int(num_threads or os.cpu_count() or 1)
    torch.set_num_threads(threads)
    wl = Workload(prompt_len, max_new_tokens, num_prompts, batch1_prompts, hf_batch1_max_new_tokens, seed)
    path = resolve_bench_model(model)
    cfg = json.loads((path / "config.json").read_text())
    vocab = int(cfg["vocab_size"])
    max_pos = cfg.get("max_position_embeddings")
    if max_pos is not None and prompt_len + max_new_tokens > int(max_pos):
        raise ValueError(f"workload needs {prompt_len} + {max_new_tokens} positions but {path} has "
                         f"max_position_embeddings={max_pos}; pass a smaller prompt_len/max_new_tokens")
    n_params = count_parameters(path)
    notes: list[str] = []

    peer_list: list[Peer] = [EnginePeer(path, routes=True), EnginePeer(path, routes=False)]
    unavailable: dict[str, str] = {}
    if peers:
        peer_list.append(TransformersPeer(path))
        lc_reason = _llama_cpp_unavailable(model, llama_cpp)
        if lc_reason is None:
            from execstate.bench.gguf_f32 import ensure_f32_gguf

            t0 = time.perf_counter()
            gguf = ensure_f32_gguf(path)
            notes.append(f"llama.cpp runs {gguf} ({time.perf_counter() - t0:.1f} s to make/find)")
            peer_list.append(LlamaCppPeer(gguf, threads, n_ctx=max(512, prompt_len + max_new_tokens + 1)))
            notes.append("llama.cpp batch 8 not measured: llama-cpp-python's high-level API decodes one "
                         "sequence per context (multi-sequence batches need the low-level llama_batch API)")
        else:
            unavailable["llama_cpp"] = lc_reason
    else:
        unavailable["transformers"] = unavailable["llama_cpp"] = "peers disabled (--no-peers)"

    resident = n_params * 4 * len(peer_list) <= RESIDENT_BUDGET_BYTES
    if not resident:
        notes.append("peers loaded one at a time per repeat (weights of all peers exceed the memory budget)")

    def n_new(peer: Peer, batched: bool) -> int:
        if isinstance(peer, TransformersPeer) and not batched and wl.hf_batch1_max_new_tokens:
            return min(wl.hf_batch1_max_new_tokens, wl.max_new_tokens)
        return wl.max_new_tokens

    warm_ids = itertools.count()

    def activate(peer: Peer) -> None:
        peer.load()
        warm = wl.prompts(vocab, next(warm_ids), "warmup")
        if peer.batch8:
            peer.run(warm[:2], WARMUP_NEW_TOKENS, batched=True)  # 2 prompts: warm, not the full prefill
        peer.run(warm[:1], WARMUP_NEW_TOKENS, batched=False)
        if isinstance(peer, EnginePeer):
            peer.cached_tokens = 0  # the warm-up's batch-1 prompt hits its own batch-8 prefix

    def deactivate(peer: Peer) -> None:
        peer.close()
        gc.collect()

    results: dict[str, dict[str, list[Any]]] = {
        p.name: {k: [] for k in ("b8_s", "b8_tok", "b8_cpu_share", "b8_load", "b1_s", "b1_tok", "b1_cpu_share",
                                 "b1_load", "b1_ttft")}
        for p in peer_list
    }
    parity: dict[str, dict[str, dict[str, int]]] = {}
    t_bench = time.perf_counter()
    if resident:
        for p in peer_list:
            activate(p)

    def measure(p: Peer, batched: bool, prompts: list[list[int]], key: str,
                ref: dict[str, dict[str, list[list[int]]]]) -> None:
        if batched and not p.batch8:
            return
        gc.collect()
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        cpu0 = time.process_time()
        res = p.run(prompts, n_new(p, batched), batched)
        # share of the machine this process got: CPU seconds / (wall seconds x threads)
        results[p.name][f"{key}_cpu_share"].append((time.process_time() - cpu0) / (res.seconds * threads))
        results[p.name][f"{key}_load"].append(load)
        results[p.name][f"{key}_s"].append(res.seconds)
        results[p.name][f"{key}_tok"].append([len(t) for t in res.token_ids])
        if res.ttft_s:
            results[p.name]["b1_ttft"].extend(res.ttft_s)
        ref.setdefault(key, {})[p.name] = res.token_ids

    def compare_to_engine(ref: dict[str, dict[str, list[list[int]]]]) -> None:
        for key, by_peer in ref.items():
            base = by_peer.get("execstate_r3_on")
            for name, tokens in by_peer.items():
                if base is not None and name != "execstate_r3_on":
                    _add_counts(parity.setdefault(name, {}).setdefault(key, {}), _compare(base, tokens))

    repeats_done = 0
    t_loop = time.perf_counter()
    for r in range(repeats):
        elapsed = time.perf_counter() - t_start
        if r > 0 and time_budget_s is not None and elapsed + (time.perf_counter() - t_loop) / r > time_budget_s:
            notes.append(f"stopped after {r} of {repeats} repeats: one more would pass the {time_budget_s:.0f} s "
                         f"time budget ({elapsed:.0f} s spent); medians are over {r} runs")
            break
        repeats_done += 1
        shapes = ((True, wl.prompts(vocab, r, "b8"), "b8"), (False, wl.prompts(vocab, r, "b1"), "b1"))
        ref: dict[str, dict[str, list[list[int]]]] = {}
        # Peer order rotates every repeat, so no peer always runs first or right after another.
        order = peer_list[r % len(peer_list):] + peer_list[: r % len(peer_list)]
        if resident:  # batch shape outer, peers inner: comparable runs are adjacent in time
            for batched, prompts, key in shapes:
                for p in order:
                    measure(p, batched, prompts, key, ref)
        else:
            for p in order:
                activate(p)
                for batched, prompts, key in shapes:
                    measure(p, batched, prompts, key, ref)
                deactivate(p)
        compare_to_engine(ref)
    bench_seconds = time.perf_counter() - t_bench

    report_peers: dict[str, Any] = {}
    for p in peer_list:
        res = results[p.name]
        entry: dict[str, Any] = {"label": p.label, "available": True}
        for key, batched, n_prompts in (("b8", True, wl.num_prompts), ("b1", False, wl.batch1_prompts)):
            if not res[f"{key}_s"]:
                entry["batch8" if batched else "batch1"] = None
                continue
            per_run = [sum(c) for c in res[f"{key}_tok"]]
            tok_s = [n / s for n, s in zip(per_run, res[f"{key}_s"], strict=True)]
            expected = n_prompts * n_new(p, batched)
            b: dict[str, Any] = {
                "median_tok_s": _median(tok_s),
                "clean_median_tok_s": _median(
                    [t for t, c in zip(tok_s, res[f"{key}_cpu_share"], strict=True) if c >= CLEAN_SHARE]),
                "clean_runs": sum(c >= CLEAN_SHARE for c in res[f"{key}_cpu_share"]),
                "best_tok_s": max(tok_s),
                "tok_s": tok_s,
                "seconds": res[f"{key}_s"],
                "tokens": per_run,
                "cpu_share": res[f"{key}_cpu_share"],
                "loadavg_1m_before": res[f"{key}_load"],
                "tokens_expected": expected,
                "tokens_exact": all(n == expected for n in per_run)
                and all(c == n_new(p, batched) for run in res[f"{key}_tok"] for c in run),
                "new_tokens_per_prompt": n_new(p, batched),
            }
            if key == "b1" and res["b1_ttft"]:
                ttft = _median(res["b1_ttft"])
                b["median_ttft_s"] = ttft
                s_per_prompt = _median([s / n_prompts for s in res["b1_s"]])
                if ttft is not None and s_per_prompt and s_per_prompt > ttft:
                    b["decode_tok_s"] = (n_new(p, batched) - 1) / (s_per_prompt - ttft)
            entry["batch8" if batched else "batch1"] = b
        if isinstance(p, EnginePeer):
            entry["startup_seconds"] = p.startup_seconds
            entry["prefix_cache_hit_tokens"] = p.cached_tokens
            if p.routes:
                entry["routed_experts_shape_ok"] = p.route_rows_ok
        if isinstance(p, TransformersPeer):
            entry["experts_implementation"] = p.experts_implementation
        if not batched_supported(p):
            entry["batch8_note"] = "not measured"
        report_peers[p.name] = entry
    for name, reason in unavailable.items():
        report_peers[name] = {"available": False, "note": reason}
    if resident:
        for p in peer_list:
            deactivate(p)

    def med(name: str, key: str, stat: str = "median_tok_s") -> float | None:
        b = report_peers.get(name, {}).get(key)
        return b[stat] if b else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    on, off = "execstate_r3_on", "execstate_r3_off"
    ratios: dict[str, Any] = {"r3_overhead": {}}
    for key in ("batch8", "batch1"):
        rr = ratio(med(on, key), med(off, key))
        bon, boff = report_peers[on][key], report_peers[off][key]
        paired = [a / b for a, b in zip(bon["tok_s"], boff["tok_s"], strict=True)]
        clean_pairs = [a / b for a, b, ca, cb in zip(bon["tok_s"], boff["tok_s"], bon["cpu_share"],
                                                     boff["cpu_share"], strict=True)
                       if ca >= CLEAN_SHARE and cb >= CLEAN_SHARE]
        rc = ratio(med(on, key, "clean_median_tok_s"), med(off, key, "clean_median_tok_s"))
        ratios["r3_overhead"][key] = {
            "on_over_off": rr,
            "slowdown_pct": None if rr is None else (1.0 - rr) * 100.0,
            "paired_ratios": paired,
            "paired_median": _median(paired),
            "clean_on_over_off": rc,
            "clean_slowdown_pct": None if rc is None else (1.0 - rc) * 100.0,
            "clean_paired_ratios": clean_pairs,
        }
        for peer in ("transformers", "llama_cpp"):
            rp = ratio(med(off, key), med(peer, key))
            if rp is not None:
                c = "clean_median_tok_s"
                ratios.setdefault(f"engine_over_{peer}", {})[key] = {
                    "r3_off": rp, "r3_on": ratio(med(on, key), med(peer, key)),
                    "clean_r3_off": ratio(med(off, key, c), med(peer, key, c)),
                    "clean_r3_on": ratio(med(on, key, c), med(peer, key, c))}
    if wl.hf_batch1_max_new_tokens and wl.hf_batch1_max_new_tokens < wl.max_new_tokens and peers:
        notes.append(f"transformers batch 1 measured {wl.hf_batch1_max_new_tokens} new tokens per prompt "
                     f"(not {wl.max_new_tokens}) to keep the run short")

    if not any(k in cfg for k in ("num_experts", "num_local_experts")):
        notes.append("dense model: route return is a no-op, so the R3 on/off ratio only shows this "
                     "bench's run-to-run noise")

    parity_out: dict[str, Any] = {}
    for name, per_key in parity.items():
        parity_out[name] = {}
        for key, c in per_key.items():
            c = dict(c)
            c["identical_fraction"] = c["identical"] / c["tokens"] if c["tokens"] else None
            parity_out[name]["batch8" if key == "b8" else "batch1"] = c

    try:
        import llama_cpp as _lc

        lc_version = _lc.__version__
    except Exception:  # noqa: BLE001 - any import failure means "not installed"
        lc_version = None
    startup = {p.name: p.startup_seconds[0] for p in peer_list if isinstance(p, EnginePeer) and p.startup_seconds}
    report: dict[str, Any] = {
        "model": str(model),
        "model_path": str(path),
        "architecture": (cfg.get("architectures") or ["?"])[0],
        "param_count": n_params,
        "is_moe": any(k in cfg for k in ("num_experts", "num_local_experts")),  # same test as the note
        "dtype": "float32",
        "workload": asdict(wl),
        "repeats": repeats_done,
        "repeats_requested": repeats,
        "threads": threads,
        "engine_startup_seconds": startup,
        "engine_startup_target_seconds": STARTUP_TARGET_S,
        "engine_startup_ok": bool(startup) and all(v < STARTUP_TARGET_S for v in startup.values()),
        "peers": report_peers,
        "ratios": ratios,
        "parity": parity_out,
        "bench_seconds": bench_seconds,
        "machine": {
            "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "platform": platform.platform(),
            "processor": _cpu_name(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "llama_cpp_python": lc_version,
            "loadavg_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "notes": notes,
    }
    if print_table:
        print(format_table(report))
    return report


def batched_supported(p: Peer) -> bool:
    return p.batch8


def _llama_cpp_unavailable(model: str | Path, wanted: bool) -> str | None:
    if not wanted:
        return "disabled"
    if str(model) != LLAMA_CPP_MODEL:
        return f"only for the dense {LLAMA_CPP_MODEL} (an F32 GGUF of the same weights)"
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError or a broken native library
        return f"not installed ({type(e).__name__}: {e})"[:200]
    return None


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _clean(b: dict[str, Any] | None) -> str:
    if not b:
        return "n/a"
    return f"{_fmt(b['clean_median_tok_s'])} ({b['clean_runs']}/{len(b['tok_s'])})"


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def format_table(report: dict[str, Any]) -> str:
    wl = report["workload"]
    lines = [
        f"execstate throughput — model {report['model']} ({report['architecture']}, "
        f"{report['param_count'] / 1e6:.1f}M params), fp32, {report['threads']} threads, "
        f"median of {report['repeats']} interleaved repeats",
        f"workload: batch 8 = {wl['num_prompts']} prompts x {wl['prompt_len']} tokens -> "
        f"{wl['max_new_tokens']} new tokens each, greedy, ignore_eos; batch 1 = {wl['batch1_prompts']} "
        f"prompts one at a time (tok/s = generated tokens / wall s, prefill included)",
        "",
        f"{'peer':<44}{'batch 8 tok/s':>14}{'batch 1 tok/s':>15}{'b8 clean (n)':>14}{'b1 clean (n)':>14}"
        f"{'b1 TTFT s':>11}{'b1 decode tok/s':>17}  runs (b8 | b1)",
    ]
    for name, e in report["peers"].items():
        if not e.get("available"):
            lines.append(f"{name:<44}{e['note']}")
            continue
        b8, b1 = e.get("batch8"), e.get("batch1")
        runs8 = " ".join(_fmt(x) for x in b8["tok_s"]) if b8 else "n/a"
        runs1 = " ".join(_fmt(x) for x in b1["tok_s"]) if b1 else "n/a"
        exact = all(b is None or b["tokens_exact"] for b in (b8, b1))
        lines.append(
            f"{e['label']:<44}{_fmt(b8['median_tok_s']) if b8 else 'n/a':>14}"
            f"{_fmt(b1['median_tok_s']) if b1 else 'n/a':>15}"
            f"{_clean(b8):>14}{_clean(b1):>14}"
            f"{_fmt(b1.get('median_ttft_s') if b1 else None, '.3f'):>11}"
            f"{_fmt(b1.get('decode_tok_s') if b1 else None):>17}  {runs8} | {runs1}"
            + ("" if exact else "  TOKEN COUNT MISMATCH")
        )
    lines.append("")
    r3 = report["ratios"]["r3_overhead"]
    for key in ("batch8", "batch1"):
        x = r3[key]
        lines.append(f"R3 overhead {key}: on/off = {_fmt(x['on_over_off'], '.3f')} "
                     f"({_fmt(x['slowdown_pct'], '+.1f')}% slowdown; paired median "
                     f"{_fmt(x['paired_median'], '.3f')}); clean runs only: "
                     f"{_fmt(x['clean_on_over_off'], '.3f')} ({_fmt(x['clean_slowdown_pct'], '+.1f')}%)")
    for peer in ("transformers", "llama_cpp"):
        rr = report["ratios"].get(f"engine_over_{peer}")
        if rr:
            parts = [f"{k} {_fmt(v['r3_off'], '.2f')}x (R3 on {_fmt(v['r3_on'], '.2f')}x; clean runs "
                     f"{_fmt(v['clean_r3_off'], '.2f')}x / {_fmt(v['clean_r3_on'], '.2f')}x)" for k, v in rr.items()]
            lines.append(f"engine / {peer}: " + ", ".join(parts))
    st = report["engine_startup_seconds"]
    lines.append("engine start: " + ", ".join(f"{k} {v:.2f} s" for k, v in st.items())
                 + f" (target < {report['engine_startup_target_seconds']:.0f} s: "
                 + ("ok" if report["engine_startup_ok"] else "MISSED") + ")")
    for name, per in report["parity"].items():
        parts = [f"{k} {c['identical']}/{c['tokens']} tokens ({100 * (c['identical_fraction'] or 0):.1f}%), "
                 f"{c['sequences_identical']}/{c['sequences']} sequences identical" for k, c in per.items()]
        lines.append(f"greedy parity vs execstate (R3 on), {name}: " + "; ".join(parts))
    for p in ("execstate_r3_on", "execstate_r3_off"):
        e = report["peers"][p]
        if e.get("prefix_cache_hit_tokens"):
            lines.append(f"WARNING {p}: {e['prefix_cache_hit_tokens']} prefix-cache hit tokens in timed runs")
        if e.get("routed_experts_shape_ok") is False:
            lines.append(f"WARNING {p}: routed_experts shape mismatch")
    hf = report["peers"].get("transformers", {})
    if hf.get("experts_implementation"):
        lines.append(f"transformers experts implementation: {hf['experts_implementation']}")
    m = report["machine"]
    lines.append(f"machine: {m['processor']}, {m['cpu_count']} CPUs, torch {m['torch']}, "
                 f"load avg after {tuple(round(x, 2) for x in m['loadavg_after'] or ())}; "
                 f"bench wall {report['bench_seconds']:.0f} s")
    shares = [x for e in report["peers"].values() if e.get("available")
              for k in ("batch8", "batch1") if e.get(k) for x in e[k]["cpu_share"]]
    loads = [x for e in report["peers"].values() if e.get("available")
             for k in ("batch8", "batch1") if e.get(k) for x in e[k]["loadavg_1m_before"]]
    if shares:
        lines.append(f"noise: CPU share of this process per run (CPU s / wall s / threads) "
                     f"min {min(shares):.2f} median {statistics.median(shares):.2f}; 1-min load avg before runs "
                     f"{min(loads):.1f}..{max(loads):.1f}; clean runs = share >= {CLEAN_SHARE}")
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
