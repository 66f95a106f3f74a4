"""A PNG timeline of one played conversation: user input, agent output per epoch, turn decisions,
delegations (created -> result) and barge-ins, in rows of ``row_s`` seconds (matplotlib, imported
when a plot is made)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from execstate.agent.agent_events import DelegationCreated, DelegationResult, OutputDelta, ResponseDone, TurnEvent
from execstate_bench.duplex_run import Played

LANES = {"user": 3.0, "agent": 2.0, "delegation": 1.0}
TURN_MARKERS = {"end_of_turn": ("v", "green"), "barge_in": ("X", "red"), "hold": ("o", "orange"),
                "resume": ("^", "orange"), "backchannel": ("o", "grey")}


def _draw(ax: Any, p: Played, cmap: Any, t_max: float) -> None:
    ev = p.events
    for m in p.marks:
        if m["kind"] == "input":
            ax.plot(m["t"], LANES["user"], "|", color="black", ms=14)
            ax.text(m["t"], LANES["user"] + 0.12, m["text"], rotation=50, fontsize=7, clip_on=True)
        elif m["kind"] == "pause":
            ax.axvspan(m["t0"], m["t1"], ymin=0.68, ymax=0.82, color="gold", alpha=0.6)
    spans: dict[str, list[float]] = {}
    texts: dict[str, str] = {}
    for e in ev:
        if isinstance(e, OutputDelta):
            spans.setdefault(e.response_id, [e.t, e.t, e.epoch])[1] = e.t
        elif isinstance(e, ResponseDone):
            texts[e.response_id] = f"{e.status}: " + " ".join(e.text.split())[:38]
    for rid, (t0, t1, epoch) in spans.items():
        ax.plot([t0, max(t1, t0 + 0.06)], [LANES["agent"]] * 2, lw=9, color=cmap(int(epoch) % 10),
                solid_capstyle="butt")
        ax.text(t0, LANES["agent"] - 0.25, f"{rid} (epoch {int(epoch)}) {texts.get(rid, '')}", fontsize=7,
                va="top", clip_on=True)
    for e in ev:
        if isinstance(e, TurnEvent):
            marker, color = TURN_MARKERS[e.kind]
            ax.plot(e.t, LANES["user"] - 0.4, marker, color=color, ms=8)
            if e.kind == "barge_in":
                ax.axvline(e.t, color="red", ls="--", lw=1.2)
        elif isinstance(e, DelegationCreated):
            res = next((r for r in ev if isinstance(r, DelegationResult) and r.delegation_id == e.delegation_id), None)
            ax.plot([e.t, res.t if res is not None else t_max], [LANES["delegation"]] * 2, lw=7, color="purple",
                    alpha=0.6, solid_capstyle="butt")
            label = f"{e.tool}({', '.join(map(str, e.arguments.values()))})"
            if res is not None:
                label += f" -> {res.result} [{res.status}]"
            ax.text(e.t, LANES["delegation"] + 0.2, label, fontsize=8, clip_on=True)
    ax.set_yticks(list(LANES.values()), ["user input", "agent output\n(colour = epoch)", "delegations"])
    ax.set_ylim(0.5, 4.3)
    ax.grid(axis="x", alpha=0.3)


def plot_timeline(p: Played, out: Path, title: str, row_s: float = 15.0) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t_max = max([e.t for e in p.events] + [m.get("t", 0.0) for m in p.marks] + [1.0]) + 0.5
    rows = max(1, math.ceil(t_max / row_s))
    fig, axes = plt.subplots(rows, 1, figsize=(16, 3.4 * rows), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for k, ax in enumerate(axes[:, 0]):
        _draw(ax, p, cmap, t_max)
        ax.set_xlim(k * row_s, (k + 1) * row_s)
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel("agent clock (s)    markers: v end of turn, X barge-in (epoch + 1), o hold (the agent "
                           "pauses), ^ resume (false interruption); yellow band: a pause in the user's turn")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
