"""The batch-size sweep of ``execstate bench throughput --sweep``, as a PNG (decode tok/s against
batch size: one line per peer, the memory-bandwidth roofline of each weight storage dashed, 70%
of it dotted;
matplotlib, imported when a plot is made) and as a text table. Each peer's legend entry has its
median CPU share (CPU s / (wall s x threads)): a plot made on a busy machine says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from execstate_bench.numbers import fmt, median

TARGET_FRACTION = 0.7  # the goal: batch-8 decode at >= 70% of the roofline
STYLES = {"execstate_r3_off": ("tab:blue", "o"), "transformers": ("tab:orange", "s"),
          "llama_cpp": ("tab:green", "^"), "vllm": ("tab:red", "D"),
          "execstate_bf16_r3_off": ("tab:cyan", "o"), "execstate_bf16arith_r3_off": ("tab:purple", "o"),
          "vllm_bf16": ("tab:pink", "D"), "execstate_gguf_r3_off": ("tab:brown", "o"),
          "llama_cpp_q4_1": ("tab:olive", "^"), "execstate_kvbf16_r3_off": ("tab:blue", "v"),
          "execstate_bf16arith_kvbf16_r3_off": ("tab:purple", "v")}
# the roofline of each weight storage: line colour and words
ROOF_STYLES = {"fp32": ("k", "fp32 weights"), "bf16": ("tab:purple", "bf16 weights"),
               "gguf": ("tab:brown", "GGUF blocks")}


def _available(report: dict[str, Any]) -> dict[str, Any]:
    return {n: e for n, e in report["peers"].items() if e.get("available") and e.get("by_batch")}


def plot_sweep(report: dict[str, Any], out: Path) -> Path:
    """Write the sweep's plot to ``out`` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = [int(b) for b in report["workload"]["batches"]]
    fig, ax = plt.subplots(figsize=(12, 6))
    roofs = {"fp32": report["roofline"], **report.get("roofline_by_storage", {})}
    for storage, roof in roofs.items():
        color, words = ROOF_STYLES.get(storage, ("grey", storage))
        ceiling = [roof["by_batch"][str(b)]["ceiling_tok_s"] for b in batches]
        head = f"roofline, {words}" + (f": batch x {_bandwidth_words(report)}\n/ weight bytes read per decode step"
                                       if storage == "fp32" else "")
        ax.plot(batches, ceiling, "--", color=color, lw=1.5, label=head)
        ax.plot(batches, [TARGET_FRACTION * c for c in ceiling], ":", color=color, lw=1.0,
                label=f"{TARGET_FRACTION:.0%} of it (target)")
    for name, e in _available(report).items():
        color, marker = STYLES.get(name, (None, "x"))
        pts = sorted((int(b), x["decode_tok_s"]) for b, x in e["by_batch"].items() if x["decode_tok_s"])
        share = median([c for x in e["by_batch"].values() for c in x["cpu_share"]])
        if pts:
            ax.plot([b for b, _ in pts], [y for _, y in pts], marker=marker, color=color, lw=2,
                    label=f"{e['label']}\n(median CPU share {fmt(share, '.2f')})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size (sequences decoded together)")
    ax.set_ylabel("decode throughput (generated tokens / s, after the first token)")
    wl = report["workload"]
    # the figure's title, from its left edge: the axes are narrow (the legend sits to their right),
    # and a title centred over them runs off the figure
    fig.suptitle(f"Decode tok/s vs batch size — {report['model']} ({report['architecture']}, "
                 f"{report['param_count'] / 1e6:.1f}M params, {report['dtype']})\n"
                 f"{wl['prompt_len']}-token prompts, {wl['max_new_tokens']} new tokens, greedy; "
                 f"{report['threads']} threads; median of {report['repeats']} repeat(s)", fontsize=10, x=0.01,
                 ha="left")
    ax.grid(True, which="both", alpha=0.3)
    busy = [n for n in report["notes"] if n.startswith("busy machine")]
    if busy:
        fig.text(0.01, 0.01, "WARNING " + busy[0], fontsize=7, color="firebrick", wrap=True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              title="CPU share = CPU s / (wall s x threads);\nbelow ~0.85 the run was starved", title_fontsize=7)
    fig.tight_layout(rect=(0, 0.03 if busy else 0, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _bandwidth_words(report: dict[str, Any]) -> str:
    """The roofline's bandwidth in words: one figure, or the range of the per-batch ones."""
    roof = report["roofline"]
    per = roof.get("bandwidth_gb_s_by_batch")
    if per:
        return (f"the bandwidth measured next to each batch size's runs ({min(per.values()):.1f}-"
                f"{max(per.values()):.1f} GB/s)")
    return f"{roof['bandwidth_gb_s']:.1f} GB/s ({report['bandwidth']['source']})"


def format_sweep_table(report: dict[str, Any]) -> str:
    """The sweep as text: decode tok/s per peer and batch size (and the share of the roofline),
    the roofline, prefill tok/s, parity and the notes."""
    batches = [str(b) for b in report["workload"]["batches"]]
    roof = report["roofline"]
    bw = report["bandwidth"]
    lines = [
        f"execstate throughput sweep — model {report['model']} ({report['architecture']}), "
        f"{report['dtype']}, {report['threads']} threads, median of {report['repeats']} repeat(s)",
        f"decode tok/s = batch x (new tokens - 1) / (run wall s - prefill probe wall s); roofline: "
        f"{_bandwidth_words(report)}"
        + (f"; at the start of the sweep {bw['read_gb_s']:.1f} GB/s" if roof.get("bandwidth_gb_s_by_batch") else ""),
        "",
        f"{'batch size':<44}" + "".join(f"{b:>16}" for b in batches),
    ]
    if roof.get("bandwidth_gb_s_by_batch"):
        lines.append(f"{'bandwidth GB/s next to the runs':<44}"
                     + "".join(f"{roof['bandwidth_gb_s_by_batch'][b]:>16.1f}" for b in batches))
    lines.append(f"{'roofline ceiling tok/s':<44}"
                 + "".join(f"{roof['by_batch'][b]['ceiling_tok_s']:>16.1f}" for b in batches))
    for storage, r in report.get("roofline_by_storage", {}).items():
        lines.append(f"{'roofline ceiling tok/s, ' + storage:<44}"
                     + "".join(f"{r['by_batch'][b]['ceiling_tok_s']:>16.1f}" for b in batches))
    for name, e in report["peers"].items():
        if not (e.get("available") and e.get("by_batch")):
            lines.append(f"{name:<44}{e.get('note', 'not measured')}")
            continue
        cells = []
        for b in batches:
            x = e["by_batch"].get(b)
            cells.append(
                "n/a"
                if x is None
                else f"{fmt(x['decode_tok_s'], '.1f')} "
                f"({fmt(x['fraction_of_roofline'] and 100 * x['fraction_of_roofline'], '.0f')}%)"
                + ("" if x["tokens_exact"] else "!")
            )
        lines.append(f"{e['label'][:43]:<44}" + "".join(f"{c:>16}" for c in cells))
    lines.append("")
    for name, e in _available(report).items():
        pre = ", ".join(f"b{b} {fmt(x['prefill_tok_s'], '.0f')}" for b, x in e["by_batch"].items())
        lines.append(f"prefill tok/s (probe), {name}: {pre}")
    for name, per in report["parity_vs_engine"].items():
        parts = [f"b{b} {c['identical']}/{c['tokens']}" for b, c in per.items()]
        ref = report["peers"].get(name, {}).get("parity_reference", "execstate")
        lines.append(f"greedy parity vs {ref}, {name}: " + ", ".join(parts))
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
