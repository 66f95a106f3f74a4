"""The PNG timeline of ``execstate bench voice``: both speakers' waveforms and the events.

Rows of ``row_s`` seconds; in each, the user's audio as sent (blue, top) and the agent's audio as
the client played it (green, bottom), with mid-utterance pauses shaded, the user's speech as the
server VAD found it (``speech_started`` |), replies (``response.created`` ^, cancelled ``x``),
holds (o) and resumes (>), delegations (D: created, R: result), the front model's end scores of
the speculatively prefilled turn (squares above the user's row, red 0 -> green 1, with the score)
and the end-of-turn decisions (purple dashed lines).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from execstate_bench.voice_client import OUT_RATE, Recording  # noqa: E402
from execstate_bench.voice_script import RATE  # noqa: E402


def _envelope(x: np.ndarray, rate: int, t0: float, step_s: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    n = max(1, int(rate * step_s))
    k = len(x) // n
    if k == 0:
        return np.zeros(0), np.zeros(0)
    env = np.abs(x[:k * n].astype(np.float32)).reshape(k, n).max(axis=1) / 32768
    return t0 + np.arange(k) * step_s, env


def _agent_envelope(rec: Recording, end: float, step_s: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """The agent's audio as played, as one envelope over time (peak per ``step_s``)."""
    env = np.zeros(int(end / step_s) + 1, np.float32)
    for t, x in rec.agent:
        for k in range(0, len(x), int(OUT_RATE * step_s)):
            i = int((t + k / OUT_RATE) / step_s)
            if 0 <= i < len(env):
                env[i] = max(env[i], float(np.abs(x[k:k + int(OUT_RATE * step_s)].astype(np.float32)).max()) / 32768)
    return np.arange(len(env)) * step_s, env


def plot_timeline(rec: Recording, out: Path, title: str, row_s: float = 20.0) -> Path:
    ends = [t for t, _ in rec.events] + [t + len(x) / OUT_RATE for t, x in rec.agent]
    end = min(rec.seconds, max(ends, default=rec.seconds) + 1.0)
    rows = max(1, int(np.ceil(end / row_s)))
    fig, axes = plt.subplots(rows, 1, figsize=(16, 1.9 * rows + 0.6), squeeze=False)
    ut, ue = _envelope(rec.user[:int(end * RATE)], RATE, 0.0)
    ut = np.array([rec.wall(int(t * RATE)) for t in ut])  # when each piece of the user's audio was sent
    segs = [_agent_envelope(rec, end)]
    for i, ax in enumerate(axes[:, 0]):
        lo, hi = i * row_s, (i + 1) * row_s
        ax.set_xlim(lo, hi)
        ax.set_ylim(-1.15, 1.35)
        ax.set_yticks([0.5, -0.5], ["user", "agent"])
        for m in rec.marks:
            if m["kind"] == "pause":
                ax.axvspan(rec.wall(m["s0"]), rec.wall(m["s1"]), color="#fff3b0", zorder=0)
        sel = (ut >= lo) & (ut < hi)
        ax.fill_between(ut[sel], 0.05, 0.05 + ue[sel] * 0.9, color="#1565c0", lw=0)
        for seg_t, seg_e in segs:
            sel = (seg_t >= lo) & (seg_t < hi)
            ax.fill_between(seg_t[sel], -0.05, -0.05 - seg_e[sel] * 0.9, color="#2e7d32", lw=0)
        for t, e in rec.events:
            if not lo <= t < hi:
                continue
            k = e["type"]
            if k == "input.end_score":
                p = float(e["p_end"])
                ax.plot(t, 1.02, "s", color=plt.cm.RdYlGn(p), ms=5, mec="#555", mew=0.4)
                ax.text(t, 1.2, f"{p:.2f}", fontsize=6, ha="center", color="#333")
            elif k == "input.turn" and e["kind"] == "end_of_turn":
                ax.axvline(t, color="#6a1b9a", ls="--", lw=1)
            elif k == "input_audio_buffer.speech_started":
                ax.plot([t, t], [0.0, 1.0], color="#0d47a1", lw=1)
            elif k == "response.created":
                ax.plot(t, -1.05, "^", color="#2e7d32", ms=6)
            elif k == "response.done" and e["response"]["status"] == "cancelled":
                ax.plot(t, -1.05, "x", color="#c62828", ms=8, mew=2)
            elif k == "input.turn" and e["kind"] == "hold":
                ax.plot(t, -0.85, "o", color="#ef6c00", ms=5)
            elif k == "input.turn" and e["kind"] == "resume":
                ax.plot(t, -0.85, ">", color="#ef6c00", ms=6)
            elif k == "delegation.created":
                ax.text(t, 1.12, "D", color="#6a1b9a", fontsize=8, ha="center")
            elif k == "delegation.result":
                ax.text(t, 1.12, "R", color="#6a1b9a", fontsize=8, ha="center")
        ax.axhline(0, color="#999", lw=0.5)
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_title(title + "\n|: user speech (VAD)  squares: end score of the prefilled turn  dashed: end of "
                         "turn  ^: reply  x: cancelled  o: hold  >: resume  D/R: delegation  yellow: pause", fontsize=9)
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
