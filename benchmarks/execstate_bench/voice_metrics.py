"""Metrics of ``execstate bench voice`` (Full-Duplex-Bench's, on audio timing), from a ``Recording``:

- response latency: the end of the user's speech (the last sample of a turn) -> the first audio
  byte of the agent's reply at the client (the first ``response.output_audio.delta`` of the first
  response created after it);
- interruption latency: the user starts speaking while the agent's audio plays -> that audio
  stops at the client (the hold that pauses it, or the cancel that clears it), over barge-ins and
  backchannels alike (both start as speech over the agent);
- takeover rate on pauses: share of mid-utterance pauses in which a reply started (a
  ``response.created`` from the pause's start to 100 ms after its end);
- false end of turn on pauses: share of mid-utterance pauses in which the server ended the
  user's turn (an ``input.turn`` ``end_of_turn`` in the same window);
- end scores: the front model's scores (``input.end_score``) of the turn's words at each turn end
  (the last score before the turn's ``end_of_turn``) and inside pauses (the last one before the
  pause ended), their p50;
- false interruptions on backchannels: share of backchannels said over the agent's audio after
  which the playing reply was cancelled;
- resume after a false interruption: backchannel start -> the reply's audio plays again (the
  ``resume`` that restarts playback);
- ASR word error rate: per user turn, the script's words against the transcripts of the input
  items that started within it (lower case, punctuation dropped, numbers as digits).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from execstate.voice.numbers import words_to_digits
from execstate_bench.voice_client import Recording


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.asarray(xs) * 1000, q)), 1) if xs else None


def norm(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", words_to_digits(text.lower().replace("-", " ")))


def edit_distance(a: list[str], b: list[str]) -> int:
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[len(b)]


def summarize(recs: list[Recording]) -> dict[str, Any]:
    resp, intr, tor, false_int, resume, false_eot = [], [], [], [], [], []
    errors = words = 0
    for r in recs:
        ev = r.events
        created = [(t, e) for t, e in ev if e["type"] == "response.created"]
        eots = [t for t, e in ev if e["type"] == "input.turn" and e["kind"] == "end_of_turn"]
        first_audio: dict[str, float] = {}
        for t, e in ev:
            if e["type"] == "response.output_audio.delta":
                first_audio.setdefault(e["response_id"], t)
        done = {e["response"]["id"]: (t, e) for t, e in ev if e["type"] == "response.done"}
        starts = {e["item_id"]: t for t, e in ev if e["type"] == "input_audio_buffer.speech_started"}
        texts = [(starts.get(e["item_id"], t), e["transcript"]) for t, e in ev
                 if e["type"] == "conversation.item.input_audio_transcription.completed"]
        for m in r.marks:
            if m["kind"] == "turn_end" and m["turn"] != "backchannel":
                t_end = r.wall(m["s"])
                nxt = next((e for t, e in created if t >= t_end), None)
                if nxt is not None and nxt["response"]["id"] in first_audio:
                    resp.append(first_audio[nxt["response"]["id"]] - t_end)
            elif m["kind"] == "pause":
                t0, t1 = r.wall(m["s0"]), r.wall(m["s1"])
                tor.append(any(t0 < t <= t1 + 0.1 for t, _ in created))
                false_eot.append(any(t0 < t <= t1 + 0.1 for t in eots))
            elif m["kind"] == "interruption" and m["audible"]:
                t_start = r.wall(m["s"])
                stop = next((t for t, _why in r.stops if t >= t_start - 0.05), None)
                if stop is not None:
                    intr.append(max(0.0, stop - t_start))
                if m["what"] == "backchannel":
                    d = done.get(m["response_id"])
                    false_int.append(d is not None and d[1]["response"]["status"] == "cancelled"
                                     and d[0] >= t_start)
                    res = next((t for t in r.resumes if t >= t_start), None)
                    if res is not None and not false_int[-1]:
                        resume.append(res - t_start)
            elif m["kind"] == "speech" and m["what"] in ("turn", "barge_in"):
                ref = norm(m["text"])
                t0, t1 = r.wall(m["s0"]), r.wall(m["s1"])
                hyp = norm(" ".join(x for t, x in texts if t0 - 0.4 <= t <= t1 + 0.1))
                errors += edit_distance(ref, hyp)
                words += len(ref)
    return {
        "response_latency_ms": {"p50": pct(resp, 50), "p99": pct(resp, 99), "n": len(resp)},
        "interruption_latency_ms": {"p50": pct(intr, 50), "p99": pct(intr, 99), "n": len(intr)},
        "takeover_rate_on_pauses": {"rate": round(float(np.mean(tor)), 3) if tor else None, "n": len(tor)},
        "false_end_of_turn_on_pauses": {"rate": round(float(np.mean(false_eot)), 3) if false_eot else None,
                                        "n": len(false_eot)},
        "false_interruptions_on_backchannels": {"rate": round(float(np.mean(false_int)), 3) if false_int else None,
                                                "n": len(false_int)},
        "resume_after_false_interruption_ms": {"p50": pct(resume, 50), "max": pct(resume, 100), "n": len(resume)},
        "asr_wer": {"wer": round(errors / words, 3) if words else None, "words": words},
    }
