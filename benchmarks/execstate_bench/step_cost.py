"""The host (Python) cost of a decode step against the context length, from the engine's own step timers.

``python -m execstate_bench.step_cost --out report.json`` builds a tiny random Llama (``make_random``, 2
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

``--runner-only`` measures the runner's host work alone (``measure_runner``: the model stubbed, the
same decode step repeated). ``--plot before=A.json,B.json after=C.json,D.json --png P.png`` draws
reports side by side.

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


class _NoModel(torch.nn.Module):
    """Stands in for the model in ``measure_runner``: the runner builds every input as for the real
    one, the forward pass returns zeros at once."""

    def __init__(self, real: Any) -> None:
        super().__init__()
        self.config, self.kernels = real.config, real.kernels
        self.hidden, self.vocab = real.config.hidden_size, real.config.vocab_size

    def forward(self, ids: torch.Tensor, ctx: Any) -> torch.Tensor:
        return torch.zeros(ids.shape[0], self.hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden.shape[0], self.vocab)


def measure_runner(contexts: list[int], batch: int, repeats: int = 200, seed: int = 0) -> dict[str, Any]:
    """The runner's host work alone for one decode step of ``batch`` requests at each context: the
    requests are prefilled by the real model, then the same decode step is run ``repeats`` times
    with the model replaced by ``_NoModel`` (the inputs, spans and attention tables are built as
    for a real step; nothing else runs, so no long forward pass evicts the host's caches). Median
    CPU microseconds of ``ModelRunner.execute`` (the CPU kernels' path) and of the torch path's
    ``DeviceInputs.load``."""
    from execstate import LLM, SamplingParams
    from execstate.model.random_models import make_random

    torch.set_num_threads(1)
    longest = max(contexts) + 600  # room for the tokens the first requests sample while the others prefill
    block = 16
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        path = make_random("llama", Path(tmp), seed=seed, num_hidden_layers=2, max_position_embeddings=longest)
        rng = np.random.default_rng(seed)
        for context in contexts:
            llm = LLM(str(path), max_model_len=longest, block_size=block, max_num_seqs=batch,
                      num_kv_blocks=batch * -(-longest // block) + 8)
            e = llm.engine
            params = SamplingParams(max_tokens=512, temperature=0.0, ignore_eos=True)
            for p in rng.integers(3, e.model_config.vocab_size, size=(batch, context - 1)).tolist():
                e.add_request({"prompt_token_ids": p}, params)
            reqs = list(e.requests.values())
            while any(len(r.output_token_ids) < 1 for r in reqs):
                e.step()
            sched = e.scheduler.schedule()
            got = [(s.request.request_id, s.num_new_tokens, s.num_computed_before) for s in sched.scheduled]
            assert len(got) == batch and all(n == 1 for _, n, _ in got), got
            runner = e.runner
            runner.model = _NoModel(runner.model)
            times: dict[str, list[float]] = {"runner": [], "device_inputs": []}
            for _ in range(repeats):
                t0 = time.thread_time()
                runner.execute(sched)
                t1 = time.thread_time()
                runner.device_runner.inputs.load(sched)
                t2 = time.thread_time()
                times["runner"].append(t1 - t0)
                times["device_inputs"].append(t2 - t1)
            points.append({"context": context, "batch": batch, "repeats": repeats, "load": _load(),
                           "us": {k: round(statistics.median(v) * 1e6, 1) for k, v in times.items()}})
    return {"tree": _tree(), "clock": "cpu", "threads": 1,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "points": points}


PANELS = (("runner", "the runner alone, CPU kernels' path\n(ModelRunner.execute, model stubbed)"),
          ("device_inputs", "the runner alone, torch path\n(DeviceInputs.load)"),
          ("host", "in the engine: schedule + inputs + sample\n+ Python of a real decode step"))


def plot(reports: dict[str, list[dict[str, Any]]], png: Path) -> None:
    """``reports`` (label -> its reports, runner-only and engine ones) against the context, a panel
    per measured quantity (``PANELS``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, t) for k, t in PANELS if any(k in r["points"][0]["us"] for rs in reports.values() for r in rs)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    loads = []
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        for (label, rs), style in zip(reports.items(), ("o--", "s-"), strict=False):
            for r in rs:
                pts = [p for p in r["points"] if key in p["us"]]
                if pts:
                    ax.plot([p["context"] for p in pts], [p["us"][key] for p in pts], style, label=label)
                    loads += [p[k] for p in pts for k in ("load", "load_before", "load_after") if k in p]
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("CPU us per decode step")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    batch = next(iter(reports.values()))[0]["points"][0]["batch"]
    fig.suptitle(f"host work of a decode step against the context: batch {batch}, tiny random Llama, 1 thread, "
                 f"CPU clock (1-min load {min(loads):.1f}-{max(loads):.1f})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="128,1024,4096,16384")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", type=Path, help="write the report (JSON) here")
    ap.add_argument("--plot", nargs="+", metavar="LABEL=REPORT.json[,REPORT.json]",
                    help="draw these reports (instead of measuring) into --png")
    ap.add_argument("--png", type=Path)
    ap.add_argument("--runner-only", action="store_true", help="measure the runner's host work alone (measure_runner)")
    a = ap.parse_args()
    if a.plot:
        if a.png is None:
            ap.error("--plot needs --png")
        plot({lab: [json.loads(Path(f).read_text()) for f in fs.split(",")] for lab, fs in (x.split("=", 1)
                                                                                           for x in a.plot)}, a.png)
        return
    if a.out is None:
        ap.error("--out is required to measure")
    contexts = [int(c) for c in a.contexts.split(",")]
    report = measure_runner(contexts, a.batch) if a.runner_only else measure(contexts, a.batch, a.steps)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    for p in report["points"]:
        print(p["context"], p["us"], f"load {p.get('load_before', p.get('load'))}")


if __name__ == "__main__":
    main()
