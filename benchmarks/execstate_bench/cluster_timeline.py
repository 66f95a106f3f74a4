"""The timeline of ``execstate bench cluster --scenario sessions`` (``cluster_sessions.py``): one
PNG, two panels sharing the time axis, the drain (shaded) and the kill (a line) marked on both:

- top: the live sessions each replica holds over time (a session belongs to the replica that
  served its latest successful step; after the kill, the killed replica's sessions not resumed yet
  are drawn dotted grey);
- bottom: steps served per second by each replica, and the steps that failed (red crosses, at the
  time they were sent), with the moments the ingress resumed a lost replica's sessions (ticks).

Also :func:`format_sessions_table`, the report's text form.
"""

from __future__ import annotations

from typing import Any

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")


def _labels(report: dict[str, Any]) -> dict[str, str]:
    tl = report["timeline"]
    ids = sorted({*tl["homes"].values(), *(s["replica"] for s in tl["steps"] if s["replica"])})
    return {rid: f"R{i + 1}" for i, rid in enumerate(ids)}


def plot_timeline(report: dict[str, Any], path: str, bin_s: float = 1.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tl, marks = report["timeline"], report["timeline"]["marks"]
    names = _labels(report)
    steps = sorted(tl["steps"], key=lambda s: s["end"])
    end = marks["end"]
    grid = np.arange(0.0, end + bin_s, 0.1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.4), sharex=True)
    home = dict(tl["homes"])
    held: dict[str, list[int]] = {rid: [] for rid in names}
    i = 0
    for t in grid:
        while i < len(steps) and steps[i]["end"] <= t:
            if steps[i]["status"] == 200 and steps[i]["replica"]:
                home[steps[i]["session"]] = steps[i]["replica"]
            i += 1
        for rid in names:
            held[rid].append(sum(1 for h in home.values() if h == rid))
    bins = np.arange(0.0, end + bin_s, bin_s)
    victim, t_kill = marks["victim"], marks["kill"]
    for k, rid in enumerate(names):
        color = _COLORS[k % len(_COLORS)]
        counts_held = np.array(held[rid], dtype=float)
        if rid == victim:  # after the kill: the dead replica's sessions not resumed yet, drawn apart
            waiting = np.where(grid >= t_kill, counts_held, np.nan)
            top.step(grid, waiting, where="post", color="grey", linestyle=":",
                     label=f"{names[rid]}'s sessions after the kill, not yet resumed")
            counts_held = np.where(grid >= t_kill, np.nan, counts_held)
        top.step(grid, counts_held, where="post", color=color, label=f"{names[rid]}")
        done = [s["end"] for s in steps if s["status"] == 200 and s["replica"] == rid]
        counts, _ = np.histogram(done, bins=bins)
        bottom.step(bins[:-1], counts / bin_s, where="post", color=color, label=f"{names[rid]} steps/s")
    failed = [s["start"] for s in steps if s["status"] != 200]
    if failed:
        bottom.plot(failed, [0.3] * len(failed), "x", color="red", label=f"failed requests ({len(failed)})")
    for resumed in report["replicas"].get("resumed", []):
        at = resumed["at"] - marks["origin_wall"]
        bottom.axvline(at, ymin=0.0, ymax=0.08, color="black", linewidth=1)
    drain, kill = report["drain"], report["kill"]
    for ax in (top, bottom):
        ax.axvspan(marks["drain_start"], marks["drain_end"], color="gold", alpha=0.35)
        ax.axvline(t_kill, color="red", linestyle="--")
    ymax = top.get_ylim()[1]
    top.text(marks["drain_start"], ymax * 0.95, f" drain {names[drain['replica']]}: {drain['moved']} moved,\n"
             f" {drain['lost']} lost, {drain['seconds']:.2f} s", fontsize=8, va="top")
    top.text(marks["kill"], ymax * 0.6, f" SIGKILL {names[kill['replica']]}: {kill['resumed']}/{kill['sessions']}"
             f" resumed,\n recovery p50 {kill['recovery_p50_s'] or 0:.1f} s, max {kill['recovery_max_s'] or 0:.1f} s",
             fontsize=8, va="top", color="darkred")
    top.set_ylabel("live sessions held")
    top.legend(fontsize=8, loc="upper right")
    bottom.set_ylabel(f"steps served per s ({bin_s:g} s bins)")
    bottom.set_xlabel("seconds since the sessions' clients started (ticks at the bottom: sessions resumed)")
    bottom.legend(fontsize=8, loc="upper right", ncol=2)
    sc = report["scenario"]
    fig.suptitle(f"execstate fleet: a drain and a SIGKILL with {report['sessions']} live sessions "
                 f"({sc['replicas']} replicas, {report['model']} model, copies every {sc['copy_every_s']:g} s; "
                 f"load {report['load_before'][0]:.1f}-{report['load_after'][0]:.1f} on {report['cpus']} shared cores)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_sessions_table(report: dict[str, Any]) -> str:
    d, k = report["drain"], report["kill"]
    gap = d["step_gap_max_s"]
    lost = sum(k["steps_lost"].values())
    return "\n".join([
        f"sessions: {report['sessions']} live, {report['steps']} steps ({report['steps_ok']} served); model "
        f"{report['model']}; load {report['load_before'][0]:.1f} -> {report['load_after'][0]:.1f}",
        f"drain of {d['replica']}: {d['sessions']} sessions, {d['moved']} moved, {d['failed']} failed, "
        f"{d['lost']} lost, {d['seconds']:.2f} s; steps refused meanwhile {d['steps_refused_during']}; longest step "
        f"gap {'-' if gap is None else f'{gap:.2f} s'}",
        f"SIGKILL of {k['replica']}: {k['sessions']} sessions, {k['resumed']} resumed, {k['lost']} lost, "
        f"{lost} steps lost in all ({k['steps_lost']}); {k['requests_failed']} requests failed {k['errors']}; "
        f"recovery p50 {k['recovery_p50_s'] or 0:.2f} s, max {k['recovery_max_s'] or 0:.2f} s; resume max "
        f"{k['resume_max_s'] or 0:.2f} s",
    ])
