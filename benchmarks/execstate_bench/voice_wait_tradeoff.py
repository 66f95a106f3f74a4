"""The long end-of-turn silence ``L`` against the p99 and the mid-sentence pauses, replayed offline
on recorded ``execstate bench voice`` runs.

With an all-or-nothing wait (the end-of-turn probe's: ``SpeechTurnConfig.graded_wait`` off), a
turn whose last end score before its end of turn is at least the threshold ends after the short
silence; any other turn waits ``L`` of silence from its last speech. A mid-utterance pause ends the
turn when its score (the last one inside it, as ``pause_scores``) reaches the threshold, or when it
lasts ``L`` or longer.

Replay of one run at a given ``L`` (the run's own scores and threshold unchanged):

- a turn scored at or above the threshold keeps its recorded end of speech -> first audio;
- any other turn ends at ``max(L + lag, asr_final + final_gap)`` (``lag``: the recorded end of
  turn minus the run's own long silence, the median over its sub-threshold turns, which covers the
  policy's tick and the event's delivery; ``final_gap``: the median end of turn minus the final
  over its turns that scored at or above the threshold: the policy needs the final), then answers
  after its own recorded end of turn -> first audio;
- a pause ends the turn when its score is at or above the threshold, or ``pause_s >= L``.

``--oracle FILE`` (written by ``--score-oracle FILE``, which needs the model: smollm2-135m, the
shipped probe) replays with the probe's scores of the words the script spoke (its final mark
dropped; the bench's system prompt and ChatML, no earlier turns, as ``end_probe_train``'s offline
evaluation) in place of the recognizer's: a turn whose true words score at or above the threshold
ends ``final_gap`` after its final. A third replay counts the wait from the segment's last speech
frame (``clock="speech"``) instead of from the stop event's arrival, which the server learns with
the recognizer's final (the recorded runs: a turn that waited ended at its final + ``L`` - 0.2 s).
``--png`` plots the p99 against the pause false-end rate over
``L``, with the goals.

    python -m execstate_bench.voice_wait_tradeoff docs/bench_voice_latency_probe.json \
        --oracle docs/voice_wait_oracle_scores.json --png docs/voice_wait_tradeoff.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

P99_GOAL_S = 0.9
PAUSE_GOAL = 0.05
SHORT_S = 0.2  # the short silence of eagerness auto (the VAD's segment end)
GRID = tuple(round(0.3 + 0.05 * i, 2) for i in range(19))  # 0.30 .. 1.20 s
_MARKS = ".?!"


@dataclass(frozen=True)
class Run:
    """One recorded run: its turns and pauses (``voice_stages`` rows), threshold and long silence."""

    name: str
    turns: list[dict[str, Any]]
    pauses: list[dict[str, Any]]
    threshold: float
    long_s: float


def pct(xs: list[float], q: float) -> float:
    """The ``q``-th percentile, linear between ranks (numpy's default, as ``voice_metrics.pct``)."""
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


def load_runs(path: Path) -> list[Run]:
    """The runs of a ``bench voice`` JSON (one report, or ``{"runs": [{"report": ...}]}``) that
    used ``semantic_vad`` with a threshold and recorded per-turn scores."""
    d = json.loads(path.read_text())
    reports = [r["report"] for r in d["runs"]] if "runs" in d else [d.get("report", d)]
    out = []
    for i, r in enumerate(reports):
        td = r.get("workload", {}).get("turn_detection", {})
        turns = r.get("turn_timelines_s", {}).get("real", [])
        if td.get("threshold") is None or not turns or "scores" not in turns[0]:
            continue
        long_s = td.get("end_of_turn_silence_ms", 1000) / 1000.0
        out.append(Run(f"{path.stem}#{i + 1}", turns, r["pause_scores"]["real"], float(td["threshold"]), long_s))
    return out


def _scored(p: float | None, threshold: float) -> bool:
    return p is not None and p >= threshold


def _graded(run: Run) -> bool:
    """The run's turn policy waited less for a mid score (the end tokens' mass scored: no ``p_mass``
    apart from ``p_end``), else all or nothing (the probe)."""
    return all(t.get("p_mass") is None or t.get("p_mass") == t.get("p_end") for t in run.turns)


def recorded_wait(run: Run, p: float | None) -> float:
    """The silence the run's policy needed after a turn scored ``p`` (``_quiet_needed``)."""
    if _scored(p, run.threshold):
        return SHORT_S
    if p is None or not _graded(run):
        return run.long_s
    return run.long_s - (run.long_s - SHORT_S) * p / run.threshold


def offsets(run: Run) -> list[float]:
    """Per turn: when the long wait's clock starts, in seconds after the end of speech. A turn that
    waited keeps its own (its end of turn minus the wait it needed); any other the final's arrival
    minus the short silence plus the run's median residual over the turns that waited (the server
    learns the segment's end with the final, and counts the silence from its last speech frame)."""
    waited = [t for t in run.turns if not _scored(t.get("p_end"), run.threshold)]
    res = [t["end_of_turn"] - recorded_wait(run, t.get("p_end")) - (t["asr_final"] - SHORT_S)
           for t in waited if "asr_final" in t]
    eps = statistics.median(res) if res else 0.0
    return [t["end_of_turn"] - recorded_wait(run, t.get("p_end")) if t in waited
            else t.get("asr_final", t["end_of_turn"]) - SHORT_S + eps for t in run.turns]


def speech_offsets(run: Run) -> list[float]:
    """Per turn: the segment's last speech frame after the end of speech (the VAD's segment end
    ``vad_silence`` less the short silence): where the long wait's clock would start if the policy
    counted from the audio's time instead of the stop event's arrival."""
    return [t.get("vad_silence", SHORT_S) - SHORT_S for t in run.turns]


def final_gap(run: Run) -> float:
    """The median end of turn minus final over the turns that ended on the short silence (0.025 if none)."""
    high = [t["end_of_turn"] - t["asr_final"] for t in run.turns if _scored(t.get("p_end"), run.threshold)
            and "asr_final" in t]
    return statistics.median(high) if high else 0.025


def replay_turns(run: Run, wait_s: float, oracle: dict[str, float] | None = None,
                 clock: str = "final") -> list[float]:
    """Each turn's end of speech -> first audio (s) with the long silence ``wait_s`` and no graded
    wait; with ``oracle`` (words spoken -> score) the turn's score is its true words'. ``clock``
    ``final``: the wait counted as recorded (``offsets``); ``speech``: from the last speech frame
    (``speech_offsets``), the turn still ending no sooner than its final + ``final_gap``."""
    gap = final_gap(run)
    out = []
    offs = offsets(run) if clock == "final" else speech_offsets(run)
    for t, off in zip(run.turns, offs, strict=True):
        reply = t["first_audio"] - t["end_of_turn"]
        if oracle is None:
            if _scored(t.get("p_end"), run.threshold):
                out.append(t["first_audio"])
                continue
        elif _scored(oracle.get(spoken(t.get("said"))), run.threshold):
            out.append(t.get("asr_final", t["end_of_turn"] - gap) + gap + reply)
            continue
        end = off + wait_s if clock == "final" else max(off + wait_s, t.get("asr_final", 0.0) + gap)
        out.append(end + reply)
    return out


def pause_ends(run: Run, wait_s: float, oracle: dict[str, float] | None = None,
               words: list[str] | None = None, clock: str = "final") -> list[float]:
    """Per pause, the chance it ends the turn with the long silence ``wait_s``: 1 when its score
    reaches the threshold, else the share of the run's turn offsets ``d`` (``offsets``) with
    ``pause_s >= d + wait_s`` (the pause's own final is not recorded); with ``oracle`` and
    ``words`` (each pause's words spoken before it) the pause's score is its true words'; ``clock``
    ``speech``: the offsets are ``speech_offsets``."""
    offs = offsets(run) if clock == "final" else speech_offsets(run)
    out = []
    for i, p in enumerate(run.pauses):
        score = p.get("p_end") if oracle is None or words is None else oracle.get(spoken(words[i]))
        out.append(1.0 if _scored(score, run.threshold) else
                   sum(p["pause_s"] >= d + wait_s for d in offs) / len(offs))
    return out


def spoken(text: str | None) -> str:
    """The script's words as the probe scores them: the final mark dropped."""
    return (text or "").strip().rstrip(_MARKS).strip()


def pause_words(seed: int, conversations: int, turns: int) -> list[str]:
    """The words before each mid-utterance pause of the bench's script, in the recording's order."""
    from execstate_bench.duplex_script import make_conversation
    from execstate_bench.voice_script import calculator_only

    out = []
    for i in range(conversations):
        for t in calculator_only(make_conversation(seed + i, turns), seed + i).turns:
            for chunks in (t.chunks, t.interruption):
                out += [" ".join(c.text for c in chunks[:j]) for j, c in enumerate(chunks) if c.pause and j > 0]
    return out


def table(runs: list[Run], grid: tuple[float, ...] = GRID, oracle: dict[str, float] | None = None,
          words: list[str] | None = None, clock: str = "final") -> list[dict[str, Any]]:
    """Per ``L``: each run's p99 and max (ms), the pooled p99, and the pauses expected to end the turn
    (the sum of ``pause_ends``) of all the runs' pauses."""
    rows = []
    for w in grid:
        lat = [replay_turns(r, w, oracle, clock) for r in runs]
        ends = [e for r in runs for e in pause_ends(r, w, oracle, words, clock)]
        rows.append({"L_s": w, "p99_ms": [round(1000 * pct(x, 99)) for x in lat],
                     "max_ms": [round(1000 * max(x)) for x in lat],
                     "pooled_p99_ms": round(1000 * pct([v for x in lat for v in x], 99)),
                     "pauses_ended": round(sum(ends), 2), "pauses": len(ends)})
    return rows


def uniform_pause_rate(wait_s: float, lo: float = 0.3, hi: float = 0.7) -> float:
    """The share of the script's pause durations (uniform on [lo, hi]) at least ``wait_s`` long."""
    return min(1.0, max(0.0, (hi - wait_s) / (hi - lo)))


def score_oracle(runs: list[Run], words: list[str], out: Path) -> None:
    """The shipped probe's scores of the spoken words of every turn and pause (needs the model)."""
    from execstate.agent.end_probe import shipped
    from execstate_bench.duplex import CHATML, SYSTEM
    from execstate_bench.end_probe_train import Front

    probe, front = shipped(), Front()
    head = front.encode(SYSTEM, special=True)
    texts = sorted({spoken(t.get("said")) for r in runs for t in r.turns if t.get("said")} | {spoken(w) for w in words})
    scores = {}
    for text in texts:
        h = front.hidden(head + front.encode(f"{CHATML['user_prefix']} {text}"))[-1]
        scores[text] = round(probe.prob(h.numpy()), 4)
    out.write_text(json.dumps(scores, indent=1, sort_keys=True) + "\n")


def plot(rows: list[dict[str, Any]], oracle_rows: list[dict[str, Any]] | None, clock_rows: list[dict[str, Any]],
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 6.2))
    for rs, label, color in ((rows, "recognizer's words", "C0"), (oracle_rows, "spoken words (oracle)", "C1"),
                             (clock_rows, "recognizer's words, wait from last speech", "C2")):
        if not rs:
            continue
        x = [100 * r["pauses_ended"] / r["pauses"] for r in rs]
        for stat, style, name in ((statistics.median, "o-", "median run"), (max, "v:", "worst run")):
            y = [stat(r["p99_ms"]) for r in rs]
            ax.plot(x, y, style, color=color, label=f"{label}: {name}'s p99")
            for r, xi, yi in zip(rs, x, y, strict=True):
                if stat is statistics.median and round(r["L_s"] * 100) % 10 == 0:
                    ax.annotate(f"{r['L_s']:.1f}", (xi, yi), textcoords="offset points", xytext=(5, -9),
                                fontsize=7, color=color)
    ax.axhline(1000 * P99_GOAL_S, color="g", lw=0.8)
    ax.axvline(100 * PAUSE_GOAL, color="g", lw=0.8)
    ax.fill_between([0, 100 * PAUSE_GOAL], 0, 1000 * P99_GOAL_S, color="g", alpha=0.12, label="both goals met")
    ax.set_xlabel("pauses that end the turn (% of the runs' pauses)")
    ax.set_ylabel("end of speech -> first agent audio, p99 (ms)")
    ax.set_title("Long silence L 0.3-1.2 s (labels: L), replayed on the recorded runs")
    ax.set_xlim(left=-2)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--oracle", type=Path, default=None, help="the spoken words' scores (--score-oracle)")
    ap.add_argument("--score-oracle", type=Path, default=None, help="write them here (loads the model)")
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the tables here")
    a = ap.parse_args(argv)
    runs = [r for f in a.files for r in load_runs(f)]
    words = pause_words(0, 3, 7)
    if a.score_oracle:
        score_oracle(runs, words, a.score_oracle)
    oracle = json.loads(a.oracle.read_text()) if a.oracle else None
    rows = table(runs)
    orows = table(runs, oracle=oracle, words=words) if oracle else None
    crows = table(runs, clock="speech")
    print(f"runs: {[r.name for r in runs]}")
    for name, rs in (("recognizer's words", rows), ("spoken words (oracle)", orows),
                     ("recognizer's words, the wait counted from the last speech frame", crows)):
        if not rs:
            continue
        print(f"\n{name}: L, p99 per run (ms), max per run, pooled p99, pauses ended, script's pauses >= L")
        for r in rs:
            print(f"{r['L_s']:.2f}  {r['p99_ms']}  {r['max_ms']}  {r['pooled_p99_ms']}  "
                  f"{r['pauses_ended']}/{r['pauses']}  {uniform_pause_rate(r['L_s']):.3f}")
    if a.json:
        a.json.write_text(json.dumps({"runs": [r.name for r in runs], "real": rows, "oracle": orows,
                                       "real_speech_clock": crows}, indent=1) + "\n")
    if a.png:
        plot(rows, orows, crows, a.png)


if __name__ == "__main__":
    main()
