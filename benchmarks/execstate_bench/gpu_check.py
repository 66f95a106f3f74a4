"""The device check: correctness and speed of the torch path on a GPU, in one run of <= 8 minutes.

``python -m execstate_bench.gpu_check --out DIR`` (``scripts/gpu_check.sh``, ``make gpu-check``)
writes ``DIR/gpu_check.json`` and ``DIR/summary.md``:

- **correctness** (four tiny MoE families): tokens and routes of the engine on CUDA against the
  engine's torch path on the CPU and against transformers on CUDA (greedy; a divergence whose top-2
  logprob gap on the CPU is under 1e-3 is reported as a near-tie); a prefix hit's routes equal the
  cold run's; bitwise replay in the deterministic mode; host round-trips of one decode step
  (``execstate_bench/host_syncs.py``) and whether CUDA graphs were captured;
- **speed** (the standard ``bench`` model, bf16 and fp32): decode tok/s and step time at batch 1, 8
  and 64, prefill 8 x 256 tok/s, the deterministic mode's decode cost, beside transformers'
  ``generate`` on the same GPU (static cache; with ``torch.compile`` where the time allows);
- **GPU utilisation** during the batch-64 decode (``torch.cuda.utilization``), and the **HBM
  roofline share** (weights + KV bytes a decode step must read, at the measured copy bandwidth,
  over the measured step time) and the prefill's share of the measured bf16 matmul rate.

Every part has a time budget and is skipped, with the reason written, when the 8 minutes run
short. ``--cpu`` runs the same code on the CPU with tiny sizes (no speed claims): the check of the
check itself (tests/gpu/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from execstate_bench import gpu_check_parts as parts
from execstate_bench.gpu_check_speed import speed

BUDGET_S = 450.0  # of the 8 minutes: the rest is start-up, model builds and writing


def main(argv: list[str] | None = None) -> int:
    from execstate.help_text import plain

    ap = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true", help="run on the CPU with tiny sizes (checks the check)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all parts")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu to check the check")
    clock = parts.Clock(args.budget)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "env": parts.environment(device)}
    work = args.out / "models"
    report["correctness"] = {arch: clock.run(f"correctness {arch}", parts.correctness, arch, work, device)
                             for arch in parts.FAMILIES}
    report["replay"] = clock.run("deterministic replay", parts.replay, work, device)
    report["host_syncs"] = clock.run("host syncs", parts.host_syncs, work, device)
    report["speed"] = clock.run("speed", speed, work, device, clock, args.cpu)
    report["timings_s"] = clock.spent
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=_plain))
    (args.out / "summary.md").write_text(summary(report))
    print(summary(report))
    return 0


def _plain(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def summary(r: dict[str, Any]) -> str:
    """The report as a short Markdown page (the figures docs/performance.md records)."""
    env = r["env"]
    lines = [f"# execstate device check, {r['date']}", "",
             f"device: {env['device_name']}; torch {env['torch']}; triton {env['triton']}; "
             f"kernel family {env['kernel_family']}; copy {env.get('copy_gbs', '?')} GB/s, "
             f"bf16 matmul {env.get('bf16_tflops', '?')} TFLOP/s", "", "## correctness", ""]
    for arch, c in r["correctness"].items():
        lines.append(f"- {arch}: {c}")
    lines += [f"- deterministic replay: {r['replay']}", f"- host round-trips per decode step: {r['host_syncs']}",
              "", "## speed", ""]
    speed = r["speed"]
    for dtype, rows in speed.items():  # a part that was skipped or failed is {"skipped"|"error": why}
        lines += [f"### {dtype}"] + ([f"- {k}: {v}" for k, v in rows.items()] if isinstance(rows, dict)
                                     else [f"- {rows}"])
    lines += ["", "## time per part (s)", ""] + [f"- {k}: {v:.1f}" for k, v in r["timings_s"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
