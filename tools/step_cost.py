"""The host (Python) cost of a decode step against the context length, from the engine's own step timers.

``python -m tools.step_cost --out report.json`` builds a tiny random Llama (``make_random``, 2
layers, hidden 64) and, for each context length, decodes ``--steps`` tokens for ``--batch``
requests whose prompts are that long, with ``EngineConfig.step_timers="cpu"`` (each segment's
CPU time on the engine thread: ``model/step_timers.py``). Per decode step it reports the means
(microseconds) of the segments that are host work: ``inputs`` (the runner building the step's
inputs), ``schedule``, ``sample`` (sampling, committing and building outputs) and ``python`` (the
rest of the step's bookkeeping), their sum ``host``, and the model's ``layers`` (attention reads
the whole context: its cost grows with it by nature). What the request costs per token shows as
the slope of ``host`` against the context. The model runs on execstate's CPU kernels when they
are built (``kernels="auto"``), single-threaded. No timing is asserted anywhere: run it under the
shared benchmark lock and record the machine's load (the report does: ``load_before`` /
``load_after``, the 1-minute load average).

``--plot before=A.json after=B.json --png P.png`` draws reports side by side.

It only uses APIs that every version of the engine has (``LLM``, ``step_timers``), so the same
script measures a tree before and after a change: run it with each tree's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HOST = ("schedule", "inputs", "sample", "python")


def _load() -> float:
    return os.getloadavg()[0]


def _tree() -> str:
    """The commit of the execstate tree that is imported (its git HEAD, '+dirty' if changed)."""
    import execstate

    root = Path(execstate.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(root)
    return f"{root} {head}{'+dirty' if dirty else ''}"


def measure(contexts: list[int], batch: int, steps: int, seed: int = 0) -> dict[str, Any]:
    from execstate import LLM, SamplingParams
    from execstate.model.random_models import make_random

    torch.set_num_threads(1)
    longest = max(contexts) + steps + 2
    block = 16
    with tempfile.TemporaryDirectory() as tmp:
        path = make_random("llama", Path(tmp), seed=seed, num_hidden_layers=2, max_position_embeddings=longest)
        llm = LLM(str(path), step_timers="cpu", max_model_len=longest, block_size=block,
                  num_kv_blocks=batch * -(-longest // block) + 8, max_num_seqs=batch)
        rng = np.random.default_rng(seed)
        vocab = llm.engine.model_config.vocab_size
        params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
        timers = llm.engine.step_timers
        llm.generate([{"prompt_token_ids": rng.integers(3, vocab, 32).tolist()}], params, use_tqdm=False)  # warm-up
        points = []
        for context in contexts:
            prompts = rng.integers(3, vocab, size=(batch, context - 1)).tolist()
            timers.records.clear()
            before = _load()
            llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            decode = [r for r in timers.records if not r.prefill and r.batch == batch]
            seg = {k: statistics.fmean(r.segments[k] for r in decode) * 1e6 for k in ("schedule", "inputs", "sample",
                                                                                     "layers", "step")}
            seg["python"] = statistics.fmean(r.python for r in decode) * 1e6
            seg["host"] = sum(seg[k] for k in HOST)
            points.append({"context": context, "batch": batch, "steps": len(decode), "load_before": before,
                           "load_after": _load(), "us": {k: round(v, 1) for k, v in seg.items()}})
    return {"tree": _tree(), "kernels": llm.engine.runner.model.kernels, "clock": "cpu", "threads": 1,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "points": points}


def plot(reports: dict[str, dict[str, Any]], png: Path) -> None:
    """``reports`` (label -> report) drawn against the context: ``inputs`` and ``host`` per decode step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, key, title in ((axes[0], "inputs", "the runner's input building"),
                           (axes[1], "host", "host work of the step (schedule + inputs + sample + Python)")):
        for (label, report), style in zip(reports.items(), ("o--", "s-"), strict=False):
            pts = report["points"]
            ax.plot([p["context"] for p in pts], [p["us"][key] for p in pts], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("CPU us per decode step")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    first = next(iter(reports.values()))
    batch = first["points"][0]["batch"]
    loads = [p[k] for r in reports.values() for p in r["points"] for k in ("load_before", "load_after")]
    fig.suptitle(f"decode step, batch {batch}, tiny random Llama on the CPU kernels, 1 thread, CPU clock "
                 f"(1-min load {min(loads):.1f}-{max(loads):.1f})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="128,1024,4096,16384")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", type=Path, help="write the report (JSON) here")
    ap.add_argument("--plot", nargs="+", metavar="LABEL=REPORT.json",
                    help="draw these reports (instead of measuring) into --png")
    ap.add_argument("--png", type=Path)
    a = ap.parse_args()
    if a.plot:
        if a.png is None:
            ap.error("--plot needs --png")
        plot({lab: json.loads(Path(f).read_text()) for lab, f in (x.split("=", 1) for x in a.plot)}, a.png)
        return
    if a.out is None:
        ap.error("--out is required to measure")
    report = measure([int(c) for c in a.contexts.split(",")], a.batch, a.steps)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    for p in report["points"]:
        print(p["context"], p["us"], f"load {p['load_before']:.2f}->{p['load_after']:.2f}")


if __name__ == "__main__":
    main()
