"""The step breakdown of ``execstate bench throughput --breakdown`` as a PNG: one panel per batch
size, milliseconds per decode step stacked by category against the context length (matplotlib,
imported when a plot is made). The title names the model, threads and the load during the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from execstate_bench.step_breakdown import CATEGORIES

COLORS = {"attention": "tab:red", "norms": "tab:pink", "rope_kv": "tab:purple", "layer_matmuls": "tab:blue",
          "experts": "tab:cyan", "routing": "tab:olive", "barriers": "black", "lm_head": "tab:green",
          "sampler": "tab:orange", "setup": "tab:brown", "python": "tab:gray"}
LABELS = {"rope_kv": "QK-norm + RoPE + K/V write", "layer_matmuls": "matmuls in the layer call",
          "experts": "MoE experts", "barriers": "barriers, fork, join", "lm_head": "LM head",
          "sampler": "sampler + outputs", "setup": "schedule, inputs, embed, final norm",
          "python": "Python (call overhead, untimed)"}


def plot_breakdown(report: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({p["batch"] for p in report["points"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(7 * len(batches), 6), squeeze=False)
    for ax, b in zip(axes[0], batches, strict=True):
        pts = sorted((p for p in report["points"] if p["batch"] == b), key=lambda p: p["context"])
        ctx = [p["context"] for p in pts]
        ys = [[p["categories_ms"][c] for p in pts] for c in CATEGORIES]
        ax.stackplot(ctx, ys, labels=[LABELS.get(c, c) for c in CATEGORIES],
                     colors=[COLORS[c] for c in CATEGORIES], alpha=0.85)
        ax.plot(ctx, [p["step_wall_ms"] for p in pts], "k--", lw=1, label="step wall time (median)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctx, [str(c) for c in ctx])
        ax.set_xlabel("context length (tokens per sequence)")
        ax.set_ylabel(f"ms per decode step ({'CPU time of the engine thread' if report['clock'] == 'cpu' else 'wall'},"
                      " mean)")
        ax.set_title(f"batch {b}")
        ax.grid(alpha=0.3)
    loads = [x for p in report["points"] for x in (p["load_before"], p["load_after"])]
    fmt = f" {report['quantization']}" if report.get("quantization") else f" {report.get('dtype', 'float32')}"
    fig.suptitle(f"decode step by phase, kernels' own timers: {report['model']}{fmt}, {report['threads']} "
                 f"thread(s), {report['started']}, 1-min load {min(loads):.1f}-{max(loads):.1f}", fontsize=11)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="center right", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.8, 0.95))
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


__all__ = ["plot_breakdown"]
