"""A PNG timeline of one played conversation: user input, agent output per epoch, turn decisions,
delegations (created -> result appended -> spoken) and barge-ins. Needs matplotlib (the ``plot``
extra)."""

from __future__ import annotations

from pathlib import Path

from execstate.bench.duplex_run import Played

LANES = {"user": 3.0, "agent": 2.0, "delegation": 1.0}


def plot_timeline(p: Played, out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = p.events
    t_max = max([e.t for e in ev] + [m.get("t", 0.0) for m in p.marks] + [1.0]) + 0.5
    fig, ax = plt.subplots(figsize=(max(14, t_max * 0.9), 5.5))
    colors = plt.get_cmap("tab10")
    for m in p.marks:
        if m["kind"] == "input":
            ax.plot(m["t"], LANES["user"], "|", color="black", ms=14)
            ax.text(m["t"], LANES["user"] + 0.12, m["text"], rotation=55, fontsize=6.5, ha="left", va="bottom")
        elif m["kind"] == "pause":
            ax.axvspan(m["t0"], m["t1"], ymin=0.72, ymax=0.86, color="gold", alpha=0.5)
    spans: dict[str, list[float]] = {}
    texts: dict[str, str] = {}
    for e in ev:
        if e.type == "response.output_text.delta":
            spans.setdefault(e.response_id, [e.t, e.t, e.epoch])[1] = e.t
        elif e.type == "response.done":
            texts[e.response_id] = f"{e.status}: {e.text.strip()[:60]}"
    for rid, (t0, t1, epoch) in spans.items():
        ax.plot([t0, max(t1, t0 + 0.06)], [LANES["agent"]] * 2, lw=8, color=colors(epoch % 10), solid_capstyle="butt")
        ax.text(t0, LANES["agent"] - 0.3, f"{rid} e{epoch}: {texts.get(rid, '')}", fontsize=6, rotation=-20,
                va="top")
    for e in ev:
        if e.type == "input.turn":
            style = {"end_of_turn": ("v", "green"), "barge_in": ("X", "red"), "hold": ("o", "orange"),
                     "resume": ("^", "orange"), "backchannel": ("o", "grey")}[e.kind]
            ax.plot(e.t, LANES["user"] - 0.35, style[0], color=style[1], ms=7)
            if e.kind == "barge_in":
                ax.axvline(e.t, color="red", ls="--", lw=1)
        elif e.type == "delegation.created":
            res = next((r for r in ev if r.type == "delegation.result" and r.delegation_id == e.delegation_id), None)
            t1 = res.t if res is not None else t_max
            ax.plot([e.t, t1], [LANES["delegation"]] * 2, lw=6, color="purple", alpha=0.6, solid_capstyle="butt")
            label = f"{e.tool}({', '.join(map(str, e.arguments.values()))})"
            if res is not None:
                label += f" -> {res.result} [{res.status}]"
            ax.text(e.t, LANES["delegation"] + 0.15, label, fontsize=7)
    ax.set_yticks(list(LANES.values()), ["user input", "agent output\n(colour = epoch)", "delegations"])
    ax.set_ylim(0.4, 4.2)
    ax.set_xlim(0, t_max)
    ax.set_xlabel("agent clock (s)   markers: v end of turn, X barge-in (epoch +1), o hold, ^ resume; "
                  "yellow: user pause")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
