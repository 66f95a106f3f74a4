"""``execstate bench throughput --breakdown``: where a decode step's time goes, by context length.

For each batch size ``b`` and context length ``c``: ``b`` fresh prompts of ``c - 1`` random
tokens are prefilled, then ``steps`` decode steps run with the engine's step timers on
(``EngineConfig.step_timers``, ``model/step_timers.py``: the kernels' own phase timers inside the
whole-layer call, timers around the rest; by default each thread's CPU time, which a shared
host's preemptions do not inflate). Each step's time is grouped into ``CATEGORIES``; the report
keeps the mean over the steps of every category (they add up to the mean step), raw segment and
kernel phase, the median wall time of a step and the machine's 1-minute load before and after.

Categories (what the plot stacks, bottom to top): attention over the context, RMSNorms,
QK-norm + RoPE + the K/V write, the matmuls inside the layer call (q/k/v, o, the router or the
dense MLP), the MoE experts kernel, routing (softmax, top-k, route capture), barriers (waits at
the barriers inside the call, its fork and join), the LM head, the sampler with output building,
the per-step setup (scheduling, input tensors, embedding and RoPE tables, the final norm) and
Python (the layer calls' argument passing, and whatever no timer names).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from execstate.model.step_timers import StepRecord
from execstate_bench.machine import cpu_name, loadavg_1m

CATEGORIES = ("attention", "norms", "rope_kv", "layer_matmuls", "experts", "routing", "barriers", "lm_head",
              "sampler", "setup", "python")


def categories(r: StepRecord) -> dict[str, float]:
    """One step's seconds by category (module docstring); they add up to the step's wall time."""
    k, s = r.kernel, r.segments
    return {
        "attention": k["attention"], "norms": k["norm"], "rope_kv": k["rope_kv"],
        "layer_matmuls": k["qkv"] + k["o_proj"] + k["router"] + k["mlp"], "experts": s["experts"] + k["experts"],
        "routing": s["routing"] + k["routing"], "barriers": k["barrier"] + k["fork"] + k["join"],
        "lm_head": s["lm_head"],
        "sampler": s["sample"], "setup": s["schedule"] + s["inputs"] + s["embed"] + s["final_norm"],
        "python": r.python + r.call_overhead,
    }


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    """Means (ms) per key: the categories' means add up to the mean step."""
    return {key: round(statistics.fmean(row[key] for row in rows) * 1e3, 4) for key in rows[0]}


def measure_point(llm: Any, batch: int, context: int, steps: int, rng: np.random.Generator) -> dict[str, Any]:
    """The medians (ms) of ``steps`` decode steps at ``batch`` x ``context`` (module docstring)."""
    from execstate.engine.sampling_params import SamplingParams

    vocab = llm.engine.model_config.vocab_size
    prompts = rng.integers(0, vocab, size=(batch, context - 1)).tolist()
    timers = llm.engine.step_timers
    timers.records.clear()
    before = loadavg_1m()
    llm.generate([{"prompt_token_ids": p} for p in prompts],
                 SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True), use_tqdm=False)
    decode = [r for r in timers.records if not r.prefill and r.batch == batch]
    if not decode:
        raise RuntimeError(f"no decode step recorded at batch {batch}, context {context}")
    return {
        "batch": batch, "context": context, "steps": len(decode), "load_before": before, "load_after": loadavg_1m(),
        "step_ms": round(statistics.fmean(r.segments["step"] for r in decode) * 1e3, 4),
        "step_wall_ms": round(statistics.median(r.wall for r in decode) * 1e3, 4),
        "categories_ms": _mean([categories(r) for r in decode]),
        "segments_ms": _mean([r.segments for r in decode]),
        "kernel_ms": _mean([r.kernel for r in decode]),
        "kernel_threads_ms": [_mean([r.kernel_threads[t] for r in decode]) for t in range(timers.threads)],
    }


def gguf_build(model: str | Path) -> Path:
    """The directory ``quantization="gguf"`` serves for ``model``: the throughput bench's GGUF build
    of a bench model (smollm2-moe: its Q4_1 build), else ``model`` itself (a directory with a .gguf)."""
    from execstate_bench.models import resolve_bench_model
    from execstate_bench.throughput import GGUF_BUILDS, gguf_build_path

    return gguf_build_path(model) if str(model) in GGUF_BUILDS else resolve_bench_model(model)


def run_breakdown(model: str = "smollm2-135m", batches: tuple[int, ...] = (1, 8),
                  contexts: tuple[int, ...] = (64, 256, 512, 1024, 2048), steps: int = 16, threads: int | None = None,
                  quantization: str | None = None, dtype: str = "float32", compute_dtype: str = "float32",
                  kernel_team: str = "full", clock: str = "cpu", seed: int = 0,
                  kv_cache_dtype: str = "auto") -> dict[str, Any]:
    """The breakdown report (module docstring). ``kernel_team``: "full" keeps the configured team
    all along (the phases of one team size); "adaptive" lets the governor choose. ``clock``: "cpu"
    (what each phase costs the thread that runs it; on a shared host the default) or "wall"."""
    from execstate.session.lm.llm import LLM
    from execstate_bench.models import resolve_bench_model

    if threads is not None:
        torch.set_num_threads(threads)
    path = gguf_build(model) if quantization == "gguf" else resolve_bench_model(model)
    llm = LLM(str(path), step_timers=clock, quantization=quantization, dtype=dtype, compute_dtype=compute_dtype,
              kernel_team=kernel_team, enable_prefix_caching=False, max_model_len=max(contexts) + steps + 2,
              kv_cache_dtype=kv_cache_dtype)
    rng = np.random.default_rng(seed)
    measure_point(llm, 1, 32, 4, rng)  # warm-up
    t0 = time.time()
    points = [measure_point(llm, b, c, steps, rng) for b in batches for c in contexts]
    return {
        "model": str(model), "quantization": quantization, "dtype": dtype, "compute_dtype": compute_dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "kernel_team": kernel_team, "threads": torch.get_num_threads(), "steps_per_point": steps, "clock": clock,
        "cpu": cpu_name(), "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)),
        "seconds": round(time.time() - t0, 1), "categories": list(CATEGORIES), "points": points,
    }


def format_breakdown_table(report: dict[str, Any]) -> str:
    head = ["batch", "context", "step wall ms", "step ms", *CATEGORIES, "load"]
    lines = [f"decode step breakdown (ms, {report['clock']} clock, mean of {report['steps_per_point']} steps): "
             f"{report['model']}"
             f"{' ' + report['quantization'] if report['quantization'] else ''}, {report['threads']} threads, "
             f"team {report['kernel_team']}",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in report["points"]:
        cat = p["categories_ms"]
        lines.append(f"| {p['batch']} | {p['context']} | {p['step_wall_ms']:.2f} | {p['step_ms']:.2f} | "
                     + " | ".join(f"{cat[c]:.2f}" for c in CATEGORIES)
                     + f" | {p['load_before']:.1f}-{p['load_after']:.1f} |")
    return "\n".join(lines)


__all__ = ["CATEGORIES", "categories", "format_breakdown_table", "gguf_build", "measure_point", "run_breakdown"]
