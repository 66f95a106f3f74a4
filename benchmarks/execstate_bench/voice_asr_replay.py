"""The recognizer alone on the voice bench's stored user audio (a ``--user-audio`` file): what the
agent would hear of each user utterance, and how late, with no server and no front model.

Each utterance of the stored conversations (a turn's parts, then its interruption if any: a
barge-in's or a backchannel's) is laid out as the bench's client sends it (its parts with their
gaps, 0.5 s of silence before, 1.6 s after) and fed in 20 ms chunks, at real time (``speed`` 1;
0: as fast as it goes), through a speech detector and ``AudioInput`` with the server VAD of
``semantic_vad`` auto (200 ms of silence, no sentence-end shortcut) into one recognizer stream per
conversation. The utterance's words are the agent's: each final joined as the listener joins them
(``Listener.with_segment``: words re-heard with earlier segments replace theirs; the final mark
dropped), and the utterance's end ends the stream's context (``end_context``), as the end of a
turn does. Per utterance (:func:`replay`): ``kind`` (``turn``, ``barge_in``, ``backchannel``), the
words spoken and heard, their word errors, ``final_s`` (wall seconds from the end of the speech to
its last final: depends on the machine's load) and, for a recognizer that runs its transcriptions
on a worker (``submit``, as ``Moonshine``), ``reheard_s``: the seconds of audio of the last
transcription started after the end of the speech (none: 0), what the final's compute grows with,
which does not depend on the load. :func:`summary` gives the WER over the utterances that are not
backchannels and the two times' p50 and largest.

    python -m execstate_bench.voice_asr_replay FILE.npz [--moonshine '{"context_s": 2.0}'] [--speed 1]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from execstate.voice.audio_input import AudioInput, Final
from execstate.voice.interfaces import Recognizer, SpeechDetector
from execstate.voice.listener import Listener
from execstate.voice.numbers import words_to_digits
from execstate.voice.vad import VadConfig
from execstate_bench.voice_metrics import edit_distance, norm
from execstate_bench.voice_script import SpokenTurn

RATE = 16000
CHUNK = 320  # 20 ms, as the bench's client sends
BEFORE_S, AFTER_S = 0.5, 1.6
VAD = VadConfig(silence_duration_ms=200, sentence_end_silence_ms=None)


def _utterances(conv: list[SpokenTurn]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for t in conv:
        out.append(("turn", t.parts))
        if t.interruption:
            out.append(("backchannel" if t.kind == "backchannel" else "barge_in", t.interruption))
    return out


class _Jobs:
    """The transcriptions a worker-based recognizer starts: (wall time, seconds of audio)."""

    def __init__(self, recognizer: Recognizer) -> None:
        self.started: list[tuple[float, float]] = []
        submit = getattr(recognizer, "submit", None)
        if submit is not None:
            def timed(samples: np.ndarray) -> Any:
                self.started.append((time.perf_counter(), len(samples) / RATE))
                return submit(samples)
            setattr(recognizer, "submit", timed)  # noqa: B010 (the instance's, for this replay only)


def replay(conversations: list[list[SpokenTurn]], recognizer: Recognizer,
           detector: Callable[[], SpeechDetector], speed: float = 1.0) -> list[dict[str, Any]]:
    """One row per utterance (module docstring)."""
    jobs, rows = _Jobs(recognizer), []
    for conv in conversations:
        stream = recognizer.open()
        inp = AudioInput(detector(), stream, VAD)
        for kind, parts in _utterances(conv):
            pieces = [np.zeros(int(BEFORE_S * RATE), np.int16)]
            for gap, u, _pause in parts:
                pieces += [np.zeros(int(gap * RATE), np.int16), u.samples]
            end = sum(len(x) for x in pieces)
            audio = np.concatenate([*pieces, np.zeros(int(AFTER_S * RATE), np.int16)])
            texts: list[tuple[int, str]] = []
            t_end = last = None
            t0 = time.perf_counter()
            for i in range(0, len(audio), CHUNK):
                if speed > 0 and (wait := t0 + i / RATE / speed - time.perf_counter()) > 0:
                    time.sleep(wait)
                if i >= end and t_end is None:
                    t_end = time.perf_counter()
                for ev in inp.process(audio[i:i + CHUNK]):
                    if isinstance(ev, Final):
                        texts = Listener.with_segment(texts, ev.audio_start, words_to_digits(ev.text), ev.heard)
                        last = time.perf_counter()
            inp.end_context()
            said = " ".join(u.text for _, u, _ in parts)
            heard = " ".join(x for _, x in texts if x.strip()).rstrip(" .?!,;:")
            after = [s for t, s in jobs.started if t_end is not None and t >= t_end]
            rows.append({"kind": kind, "said": said, "heard": heard,
                         "errors": edit_distance(norm(said), norm(heard)), "words": len(norm(said)),
                         "final_s": round(last - t_end, 3) if last is not None and t_end is not None else None,
                         "reheard_s": round(after[-1], 2) if after else 0.0})
        stream.close()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """WER over the utterances that are not backchannels, ``final_s`` and ``reheard_s`` p50 / max."""
    rs = [r for r in rows if r["kind"] != "backchannel"]
    words = sum(r["words"] for r in rs)
    out: dict[str, Any] = {"utterances": len(rs), "words": words,
                           "wer": round(sum(r["errors"] for r in rs) / words, 3) if words else None}
    for k in ("final_s", "reheard_s"):
        xs = [r[k] for r in rs if r[k] is not None]
        out[k] = {"p50": round(float(np.percentile(xs, 50)), 3), "max": max(xs)} if xs else None
    return out


def main(argv: list[str] | None = None) -> None:
    from execstate.voice.moonshine_asr import Moonshine
    from execstate.voice.silero import SileroModel, SileroVAD
    from execstate_bench.voice_audio_store import load, workload_of

    ap = argparse.ArgumentParser(prog="python -m execstate_bench.voice_asr_replay", description=__doc__.split("\n")[0])
    ap.add_argument("user_audio", help="a file written by execstate bench voice --user-audio")
    ap.add_argument("--moonshine", default="{}", help="Moonshine's keyword arguments, as JSON")
    ap.add_argument("--speed", type=float, default=1.0, help="1: real time; 0: as fast as it goes")
    args = ap.parse_args(argv)
    convs = load(args.user_audio, workload_of(args.user_audio))
    model = SileroModel()
    rows = replay(convs, Moonshine(**json.loads(args.moonshine)), lambda: SileroVAD(model), args.speed)
    print(json.dumps({"moonshine": json.loads(args.moonshine), "speed": args.speed, "summary": summary(rows),
                      "utterances": rows}, indent=1))


if __name__ == "__main__":
    main()
