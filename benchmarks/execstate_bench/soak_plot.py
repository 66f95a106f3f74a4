"""The soak's PNG: what was recorded over time (``soak.py``), fault windows shaded in every panel.

Four panels sharing the time axis: the server's RSS (MB) with its open fds and threads (the warm-up's
end dotted, the band of 5 % around RSS after warm-up shaded); the KV
blocks in use, tier units per tier and live sessions / agents / world sessions; each surface's p99
per window (seconds, log scale); the outcomes that were not a success per window (4xx from the
bursts, cut clients, any 5xx), by outcome.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def plot_soak(report: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(11, 13), sharex=True)
    ax = axes[0]
    ax.plot(t, [s["rss_mb"] for s in samples], color="tab:blue", label="RSS (MB)")
    ax.set_ylabel("RSS (MB)")
    rss = report["verdict"]["rss"]
    if "max_deviation" in rss:  # the goal's band: within 5 % of the first sample after warm-up
        base = rss["after_warmup"]
        ax.axvline(report["warmup_s"] / 60, color="tab:blue", linestyle=":", linewidth=1)
        ax.axhspan(base * 0.95, base * 1.05, xmin=0, xmax=1, color="tab:blue", alpha=0.08,
                   label="after warm-up +/- 5 %")
    twin = ax.twinx()
    twin.plot(t, [s["fds"] for s in samples], color="tab:orange", label="open fds")
    twin.plot(t, [s["threads"] for s in samples], color="tab:green", label="threads")
    twin.set_ylabel("fds, threads")
    ax.legend(loc="upper left")
    twin.legend(loc="upper right")
    ax = axes[1]
    ax.plot(t, [s["blocks_used"] for s in samples], label="KV blocks in use")
    for tier in sorted({k for s in samples for k in s["tier_units"]}):
        ax.plot(t, [s["tier_units"].get(tier, float("nan")) for s in samples], label=f"{tier} tier units")
    for kind in ("sessions", "agents", "world_sessions"):
        ax.plot(t, [s["sessions"].get(kind, float("nan")) for s in samples], linestyle="--", label=kind)
    ax.set_ylabel("count")
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax = axes[2]
    for surface in sorted({k for s in samples for k in s["p99"]}):
        ax.plot(t, [s["p99"].get(surface, float("nan")) for s in samples], marker=".", linewidth=0.8, label=surface)
    ax.set_yscale("log")
    ax.set_ylabel("p99 per window (s)")
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    ax = axes[3]
    series: dict[str, list[int]] = defaultdict(lambda: [0] * len(samples))
    for i, s in enumerate(samples):
        for key, n in s["outcomes"].items():
            outcome = key.split(":", 1)[1]
            if outcome not in ("200", "ok"):
                series[outcome][i] += n
    for outcome, ys in sorted(series.items()):
        ax.plot(t, ys, marker=".", linewidth=0.8, label=outcome)
    ax.set_ylabel("not-ok outcomes per window")
    ax.set_xlabel("minutes")
    ax.legend(loc="upper left", fontsize=7, ncol=4)
    for a in axes:
        for w in report["faults"]:
            if w["end"] > w["start"]:
                a.axvspan(w["start"] / 60, w["end"] / 60, color="grey", alpha=0.15)
    for w in report["faults"]:
        axes[0].annotate(w["fault"], (w["start"] / 60, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                         rotation=90, va="top")
    v = report["verdict"]
    fig.suptitle(f"execstate bench soak: {report['minutes']:g} min, {report['clients']} clients, "
                 f"{report['operations']} operations; goals {'met' if v['met'] else 'NOT met'}\n"
                 f"(RSS {v['rss']['change']:+.1%} at the end, {rss.get('max_deviation', float('nan')):+.1%} at most; "
                 f"fds {v['fds']['change']:+.1%}, leaked blocks "
                 f"{v['leaked_blocks']['value']:g}, unexpected 5xx {v['unexpected_5xx']['count']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
