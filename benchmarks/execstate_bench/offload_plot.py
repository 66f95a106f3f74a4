"""The PNG of ``bench offload --png``: TTFT per tier configuration (chat workload) and reload time
vs prompt tokens per tier, with recompute for comparison (log-log)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_COLORS = {"recompute": "#444444", "dram": "#1f77b4", "disk": "#2ca02c", "disk-cold": "#98df8a", "redis": "#d62728"}


def plot_offload(report: dict, path: str) -> None:
    chat, rel = report.get("chat"), report.get("reload")
    panels = [p for p in (chat, rel) if p]
    if not panels:
        raise ValueError("nothing to plot: run the chat or reload part")
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.4), squeeze=False)
    ax_iter = iter(axes[0])
    if chat:
        ax = next(ax_iter)
        names = list(chat["configs"])
        p50 = [chat["configs"][n]["ttft_p50_s"] * 1e3 for n in names]
        p99 = [chat["configs"][n]["ttft_p99_s"] * 1e3 for n in names]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], p50, width=0.4, label="p50", color="#1f77b4")
        ax.bar([i + 0.2 for i in x], p99, width=0.4, label="p99", color="#aec7e8")
        for i, v in enumerate(p50):
            ax.text(i - 0.2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x), names, rotation=12)
        ax.set_yscale("log")
        ax.set_ylim(bottom=min(p50) / 2)
        ax.set_ylabel("TTFT (ms, log scale)")
        w = chat["workload"]
        ax.set_title(f"chat, working set {w['working_set_over_pool']:.1f}x the pool ({w['requests']} requests)")
        ax.legend()
    if rel:
        ax = next(ax_iter)
        lengths = [int(n) for n in rel["rows"]]
        ax.plot(lengths, [rel["rows"][str(n)]["recompute_ttft_s"] * 1e3 for n in lengths], "o-",
                color=_COLORS["recompute"], label="recompute")
        tiers = [t for t in rel["rows"][str(lengths[0])] if isinstance(rel["rows"][str(lengths[0])][t], dict)]
        for t in tiers:
            ax.plot(lengths, [rel["rows"][str(n)][t]["ttft_s"] * 1e3 for n in lengths], "o-",
                    color=_COLORS.get(t), label=f"reload from {t}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in lengths])
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT (ms, median)")
        ax.set_title("reload from a tier vs recompute")
        ax.legend(fontsize=8)
    fig.suptitle(f"execstate offload tiers ({report['model']})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
