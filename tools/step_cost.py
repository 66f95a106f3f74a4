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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="128,1024,4096,16384")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    report = measure([int(c) for c in a.contexts.split(",")], a.batch, a.steps)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    for p in report["points"]:
        print(p["context"], p["us"], f"load {p['load_before']:.2f}->{p['load_after']:.2f}")


if __name__ == "__main__":
    main()
