"""Where a reply's latency goes in ``execstate bench voice``: one turn's timeline, from the client's events.

For each user turn answered (a ``turn_end`` mark that is not a backchannel, with a reply whose
audio reached the client), the time from the end of the user's speech (the turn's last sample, as
sent) to the first of each event after it, in the order the server's pipeline produces them:

- ``vad_silence``: when the audio where the VAD ended the segment (``speech_stopped``'s
  ``audio_end_ms``: the speech's end and the VAD's silence) was sent: the silence wait alone;
- ``vad_stopped``: ``input_audio_buffer.speech_stopped`` of the turn's last segment (its
  ``audio_end_ms`` past the turn's last sample) arriving: the silence wait, the detector's lag
  and, in the same batch of input events, the recognizer's final;
- ``asr_final``: ``conversation.item.input_audio_transcription.completed`` (the recognizer's final);
- ``end_of_turn``: ``input.turn`` of kind ``end_of_turn`` (the turn policy: end score, silences);
- ``response_created``: the reply's ``response.created``;
- ``first_text``: its first ``response.output_audio_transcript.delta`` (the front's first words:
  the speculative prefill's catch-up and the first decode step(s));
- ``first_audio``: its first ``response.output_audio.delta`` (the speech synthesiser's first chunk).

``stage_breakdown`` gives each one's p50 and p99 (ms) over the turns where it was seen, and
``turn_timelines`` the per-turn rows (for a table or a plot), each with ``p_end``: the front
model's last end score (``input.end_score``) before the turn's end (None: not scored; ``p_mass``
the end tokens' mass of that step, which the turn policy reads when no end-of-turn probe scores), and
``text``: the words it scored, and ``said``: the words the user spoke in the turn (the script's,
None when the recording has no speech mark ending there). :func:`agent_words_wer` is the word
error rate of the words the agent answered (each turn's ``text``) against ``said``: the
recognizer as the agent hears it, re-heard words and all (the client's transcripts are each
segment's own words). ``pause_scores``: the same inside each mid-utterance pause (the
last score from the pause's start to 100 ms after its end): what a threshold must stay above.

For replaying other end-of-turn rules on a run, each turn row also has ``scores``: every end score
of the turn, ``[seconds after the end of the speech (negative: before), p_end]``, from the previous
turn's end to its own end of turn, and ``final``: the recognizer's final transcript as sent (its
punctuation and capitals kept; the words scored have no final mark); each pause row has ``scores``
(seconds after the pause's end) and ``partial``: the recognizer's last hypothesis inside it (the
transcription deltas' ``partial``, None: none).
"""

from __future__ import annotations

from typing import Any

from execstate_bench.voice_client import Recording
from execstate_bench.voice_metrics import edit_distance, norm, pct

STAGES = ("vad_silence", "vad_stopped", "asr_final", "end_of_turn", "response_created", "first_text", "first_audio")
_INPUT = {"asr_final": "conversation.item.input_audio_transcription.completed"}


def turn_timelines(rec: Recording) -> list[dict[str, Any]]:
    """Per answered turn: each stage's seconds after the end of the user's speech (module docstring)."""
    ev = rec.events
    out = []
    t_prev = float("-inf")  # the previous turn's end
    for m in rec.marks:
        if m["kind"] != "turn_end" or m["turn"] == "backchannel":
            continue
        t_end = rec.wall(m["s"])
        since, t_prev = t_prev, t_end
        created = next((e for t, e in ev if t >= t_end and e["type"] == "response.created"), None)
        if created is None:
            continue
        rid = created["response"]["id"]
        row: dict[str, Any] = {}
        row["said"] = next((s["text"] for s in rec.marks if s["kind"] == "speech" and s["s1"] == m["s"]), None)
        stop = next(((t, e) for t, e in ev if t >= t_end and e["type"] == "input_audio_buffer.speech_stopped"
                     and e.get("audio_end_ms", 1 << 40) * 16 >= m["s"]), None)  # the turn's last segment's
        if stop is not None:
            row["vad_stopped"] = stop[0] - t_end
            if "audio_end_ms" in stop[1]:
                row["vad_silence"] = rec.wall(stop[1]["audio_end_ms"] * 16) - t_end
        final = next(((t, e) for t, e in ev if t >= (stop[0] if stop else t_end) and e["type"] == _INPUT["asr_final"]),
                     None)
        if final is not None:
            row["asr_final"] = final[0] - t_end
        row["final"] = final[1].get("transcript") if final is not None else None
        t = next((t for t, e in ev if t >= t_end and e["type"] == "input.turn" and e.get("kind") == "end_of_turn"),
                 None)
        if t is not None:
            row["end_of_turn"] = t - t_end
            score = next((e for te, e in reversed(ev) if te <= t and e["type"] == "input.end_score"), None)
            row["p_end"], row["text"] = (score["p_end"], score["text"]) if score else (None, None)
            row["p_mass"] = score.get("p_mass") if score else None
            row["scores"] = [[round(te - t_end, 3), e["p_end"]] for te, e in ev
                             if since < te <= t and e["type"] == "input.end_score"]
        for name, kind in (("response_created", "response.created"),
                           ("first_text", "response.output_audio_transcript.delta"),
                           ("first_audio", "response.output_audio.delta")):
            t = next((t for t, e in ev if t >= t_end and e["type"] == kind
                      and (e.get("response_id") or e.get("response", {}).get("id")) == rid), None)
            if t is not None:
                row[name] = t - t_end
        if "first_audio" in row:
            out.append(row)
    return out


def stage_breakdown(recs: list[Recording]) -> dict[str, dict[str, Any]]:
    """Each stage's p50 / p99 (ms) and count over every answered turn of ``recs``."""
    rows = [r for rec in recs for r in turn_timelines(rec)]
    return {s: {"p50": pct(xs, 50), "p99": pct(xs, 99), "n": len(xs)}
            for s in STAGES for xs in [[r[s] for r in rows if s in r]]}


def agent_words_wer(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The word error rate of the words each turn was answered on (``text``; a turn not scored has
    none) against the words spoken (``said``), over the rows that know the latter."""
    errors = words = 0
    for r in rows:
        if r.get("said") is not None:
            ref = norm(r["said"])
            errors += edit_distance(ref, norm(r.get("text") or ""))
            words += len(ref)
    return {"wer": round(errors / words, 3) if words else None, "words": words}


def pause_scores(rec: Recording) -> list[dict[str, Any]]:
    """The last end score inside each mid-utterance pause (module docstring)."""
    out = []
    for m in rec.marks:
        if m["kind"] == "pause":
            t0, t1 = rec.wall(m["s0"]), rec.wall(m["s1"])
            inside = [(t, e) for t, e in rec.events if t0 < t <= t1 + 0.1]
            scores = [(t, e) for t, e in inside if e["type"] == "input.end_score"]
            e = scores[-1][1] if scores else None
            partial = next((e["partial"] for _, e in reversed(inside)
                            if e["type"] == "conversation.item.input_audio_transcription.delta"), None)
            out.append({"pause_s": round(t1 - t0, 3), "p_end": e["p_end"] if e else None,
                        "p_mass": e.get("p_mass") if e else None, "text": e["text"] if e else None, "partial": partial,
                        "scores": [[round(t - t1, 3), e["p_end"]] for t, e in scores]})
    return out
