"""``execstate bench throughput --contention 4,8,16``: decode under added CPU load, team policies side by side.

A shared host is the normal case for a CPU server. This bench adds ``n`` busy processes (plain
spinning loops at normal priority, ``burners``) for each load level and measures, alternated in
one process so the load hits both alike, batch-1 and batch-8 decode tok/s of two engines on the
same weights that differ only in ``EngineConfig.kernel_team``:

- ``full``: every kernel call on the whole OpenMP team (the behaviour before the governor);
- ``adaptive``: ``kernels/team.py``'s governor picks the team or one thread per layer call.

Per level and policy it reports the decode tok/s of every run (after the first token, so the
prefill does not enter), their median, the ratio adaptive / full, the governor's mode at the end
(how many of its probes and switches), and the 1-minute load average before and after each run.
Both engines produce the same tokens (checked: the kernels are thread-count invariant).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from execstate_bench.machine import loadavg_1m, settle

POLICIES = ("full", "adaptive")
_BURN = "import os\nos.nice(0)\nwhile True:\n    pass\n"


@contextmanager
def burners(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` busy-looping processes for the duration of the block (killed, by their own ids, after)."""
    procs = [subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(n)]
    try:
        time.sleep(1.0 if n else 0.0)  # let the scheduler spread them
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _decode_rate(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """Decode tok/s after the first token of a batch of prompts, and the generated ids."""
    from execstate.engine.sampling_params import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    end = time.monotonic()
    first = max(o.metrics["first_token_time"] for o in outs)
    return len(prompts) * (max_tokens - 1) / max(end - first, 1e-9), [list(o.outputs[0].token_ids) for o in outs]


def run_contention_bench(model: str = "smollm2-135m", loads: tuple[int, ...] = (0, 4, 8, 16), repeats: int = 3,
                         batches: tuple[int, ...] = (1, 8), prompt_len: int = 64, max_tokens: int = 32,
                         quantization: str | None = None, seed: int = 0, out: str | None = None) -> dict[str, Any]:
    """The report (module docstring); engines built once and reused across load levels. ``out``:
    the report so far is written there after every level (a long run cut short keeps its levels)."""
    from execstate.session.lm.llm import LLM
    from execstate_bench.models import resolve_bench_model

    path = resolve_bench_model(model)
    engines = {p: LLM(str(path), kernel_team=p, quantization=quantization) for p in POLICIES}
    vocab = engines["full"].engine.model_config.vocab_size
    rng = np.random.default_rng(seed)
    warm = rng.integers(0, vocab, size=(1, prompt_len)).tolist()
    for llm in engines.values():
        _decode_rate(llm, warm, 4)
    levels = []
    for n in loads:
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {p: {b: [] for b in batches} for p in POLICIES}
        mismatches = 0
        with burners(n):
            for r in range(repeats):
                for b in batches:
                    prompts = rng.integers(0, vocab, size=(b, prompt_len)).tolist()
                    order = POLICIES if r % 2 == 0 else POLICIES[::-1]
                    tokens = {}
                    for p in order:
                        settle()
                        before = loadavg_1m()
                        rate, tokens[p] = _decode_rate(engines[p], prompts, max_tokens)
                        runs[p][b].append({"tok_s": round(rate, 2), "load_before": before,
                                           "load_after": loadavg_1m()})
                    mismatches += sum(x != y for x, y in zip(tokens["full"], tokens["adaptive"], strict=True))
        gov = engines["adaptive"].engine.runner.team
        level: dict[str, Any] = {"burners": n, "token_mismatches": mismatches, "batches": {}}
        for b in batches:
            med = {p: statistics.median(x["tok_s"] for x in runs[p][b]) for p in POLICIES}
            level["batches"][str(b)] = {
                "runs": {p: runs[p][b] for p in POLICIES}, "median_tok_s": med,
                "adaptive_over_full": round(med["adaptive"] / med["full"], 3),
            }
        if gov is not None:
            level["governor"] = {"solo": gov.solo, "probes": gov.probes, "switches": gov.switches}
        levels.append(level)
        if out:
            Path(out).write_text(json.dumps({"model": str(model), "levels": levels, "partial": True}, indent=1))
    return {"model": str(model), "quantization": quantization, "prompt_len": prompt_len, "max_tokens": max_tokens,
            "repeats": repeats, "threads": torch.get_num_threads(), "levels": levels}


def format_contention_table(report: dict[str, Any]) -> str:
    lines = [f"decode tok/s under added load: {report['model']}, {report['threads']} threads, "
             f"{report['repeats']} alternated repeats",
             "| added busy processes | batch | load (1 min) | full team | adaptive | adaptive / full |",
             "|---|---|---|---|---|---|"]
    for lv in report["levels"]:
        for b, row in lv["batches"].items():
            loads = [x["load_before"] for p in POLICIES for x in row["runs"][p]]
            lines.append(f"| {lv['burners']} | {b} | {min(loads):.1f}-{max(loads):.1f} | "
                         f"{row['median_tok_s']['full']:.1f} | {row['median_tok_s']['adaptive']:.1f} | "
                         f"{row['adaptive_over_full']:.2f}x |")
    return "\n".join(lines)


__all__ = ["burners", "format_contention_table", "run_contention_bench"]
