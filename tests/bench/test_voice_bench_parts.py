"""``execstate bench voice``'s parts without a server: the oracle recognizer's transcripts, the
metrics and a turn's latency by stage on a known recording."""

from __future__ import annotations

import numpy as np

from execstate_bench.voice_client import TICK, Recording
from execstate_bench.voice_metrics import edit_distance, norm, summarize
from execstate_bench.voice_oracle import OracleRecognizer
from execstate_bench.voice_stages import agent_words_wer, pause_scores, stage_breakdown, turn_timelines


class _Null:
    sample_rate = 16000

    def open(self):
        return self

    def start(self, at_sample):
        self.fed = 0

    def feed(self, samples):
        self.fed += len(samples)
        return None

    def finish(self):
        return "whatever the real one heard"

    def close(self):
        pass


def test_oracle_words_at_the_recognizers_timing() -> None:
    o = OracleRecognizer(_Null())
    o.place(1000, ((0, 4000, "What"), (4000, 8000, "is"), (8000, 16000, "this?")))
    s = o.open()
    s.start(0)
    assert s.feed(np.zeros(5000, np.int16)) == "What"  # the word's audio ended at 5000
    assert s.feed(np.zeros(3000, np.int16)) is None  # "is" ends at 9000: not yet
    assert s.feed(np.zeros(1000, np.int16)) == "What is"
    assert s.finish() == "What is"  # "this?" was cut by the segment: the next segment's
    s.start(9000)
    s.feed(np.zeros(9000, np.int16))
    assert s.finish() == "this?"
    assert s.finish() == ""  # each word in one final only


def _rec() -> Recording:
    r = Recording(np.zeros(16000 * 20, np.int16))
    r.sent_t = [k * TICK / 16000 for k in range(1000)]  # sent on time
    ev = [(2.3, {"type": "response.created", "response": {"id": "r1"}}),
          (2.5, {"type": "response.output_audio.delta", "response_id": "r1"}),
          (5.0, {"type": "input_audio_buffer.speech_started", "item_id": "i2"}),
          (5.03, {"type": "input.turn", "kind": "hold"}),
          (6.5, {"type": "input.turn", "kind": "resume"}),
          (9.0, {"type": "response.done", "response": {"id": "r1", "status": "completed"}}),
          (1.0, {"type": "input_audio_buffer.speech_started", "item_id": "i1"}),
          (2.2, {"type": "conversation.item.input_audio_transcription.completed", "item_id": "i1",
                 "transcript": "tell me a story"})]
    r.events = sorted(ev, key=lambda x: x[0])
    r.stops = [(5.03, "hold")]
    r.resumes = [6.5]
    r.marks = [{"kind": "speech", "what": "turn", "s0": 16000, "s1": 32000, "text": "Tell me a long story."},
               {"kind": "pause", "s0": 20000, "s1": 28000},
               {"kind": "turn_end", "s": 32000, "turn": "backchannel", "answer": None},
               {"kind": "turn_end", "s": 32000, "turn": "plain", "answer": None},
               {"kind": "interruption", "what": "backchannel", "s": 80000, "s_end": 88000, "audible": True,
                "response_id": "r1"}]
    return r


def test_metrics_on_a_known_recording() -> None:
    m = summarize([_rec()])
    assert m["response_latency_ms"] == {"p50": 500.0, "p99": 500.0, "n": 1}  # end at 2.0 s, audio at 2.5 s
    assert m["interruption_latency_ms"]["p50"] == 30.0  # speech at 5.0 s, hold at 5.03 s
    assert m["takeover_rate_on_pauses"] == {"rate": 0.0, "n": 1}
    assert m["false_interruptions_on_backchannels"] == {"rate": 0.0, "n": 1}
    assert m["resume_after_false_interruption_ms"]["p50"] == 1500.0
    assert m["asr_wer"] == {"wer": 0.2, "words": 5}  # "long" was not heard: one deletion in five words


def test_wer_parts() -> None:
    assert norm("Quick question, what is seventeen times 23?") == ["quick", "question", "what", "is", "17", "times",
                                                                  "23"]
    assert edit_distance(["a", "b", "c", "d"], ["a", "x", "c"]) == 2


def test_an_end_of_turn_inside_a_pause_is_a_false_end_of_turn() -> None:
    r = _rec()
    assert summarize([r])["false_end_of_turn_on_pauses"] == {"rate": 0.0, "n": 1}
    r.events = sorted([*r.events, (1.5, {"type": "input.turn", "kind": "end_of_turn"})], key=lambda x: x[0])
    assert summarize([r])["false_end_of_turn_on_pauses"] == {"rate": 1.0, "n": 1}  # the pause is 1.25-1.75 s


def test_a_turns_latency_by_stage_and_the_scores_it_was_decided_on() -> None:
    rec = Recording(np.zeros(16000 * 6, np.int16), sent_t=[k * TICK / 16000 for k in range(300)])
    rec.marks = [{"kind": "pause", "s0": 8000, "s1": 16000},
                 {"kind": "speech", "what": "turn", "s0": 4000, "s1": 32000, "text": "Tell me a story."},
                 {"kind": "turn_end", "turn": "plain", "s": 32000},
                 {"kind": "turn_end", "turn": "backchannel", "s": 64000}]
    score = {"type": "input.end_score", "item_id": "i1"}
    rec.events = [
        (0.6, {"type": "conversation.item.input_audio_transcription.delta", "delta": "tell", "partial": "Tell."}),
        (0.65, {"type": "conversation.item.input_audio_transcription.delta", "delta": " me", "partial": "Tell me."}),
        (0.7, {**score, "p_end": 0.02, "p_mass": 0.01, "text": "tell me"}),  # inside the pause (0.5-1.0 s)
        (1.9, {**score, "p_end": 0.3, "text": "tell me a"}),
        (2.1, {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 2060}),  # the speech ended at 2.0 s
        (2.15, {"type": "conversation.item.input_audio_transcription.completed", "transcript": "Tell me a story."}),
        (2.25, {**score, "p_end": 0.8, "p_mass": 0.35, "text": "tell me a story"}),  # the probe's, the mass
        (2.3, {"type": "input.turn", "kind": "end_of_turn"}),
        (2.31, {"type": "response.created", "response": {"id": "r1"}}),
        (2.4, {"type": "response.output_audio_transcript.delta", "response_id": "r1"}),
        (2.45, {"type": "response.output_audio.delta", "response_id": "r1"}),
    ]
    rows = turn_timelines(rec)
    assert len(rows) == 1  # the backchannel is not a turn
    got = {k: round(v, 3) if isinstance(v, float) else v for k, v in rows[0].items()}
    assert got == {"said": "Tell me a story.",  # the words spoken in the turn (the speech mark ending there)
                   "vad_silence": 0.06, "vad_stopped": 0.1, "asr_final": 0.15, "end_of_turn": 0.3, "p_end": 0.8,
                   "p_mass": 0.35, "text": "tell me a story", "final": "Tell me a story.",
                   "scores": [[-1.3, 0.02], [-0.1, 0.3], [0.25, 0.8]],  # every score of the turn, from the speech's end
                   "response_created": 0.31, "first_text": 0.4, "first_audio": 0.45}
    stages = stage_breakdown([rec])
    assert stages["end_of_turn"] == {"p50": 300.0, "p99": 300.0, "n": 1}
    assert stages["first_audio"]["p50"] == 450.0
    assert pause_scores(rec) == [{"pause_s": 0.5, "p_end": 0.02, "p_mass": 0.01, "text": "tell me",
                                  "partial": "Tell me.", "scores": [[-0.3, 0.02]]}]


def test_the_words_the_agent_answered_against_the_words_spoken() -> None:
    rows = [{"said": "Tell me a story about trains.", "text": "Tell me a story about rain"},  # 1 of 6 wrong
            {"said": "What is 12 times 80?", "text": "What is twelve times"},  # 1 of 5 missing (digits normalised)
            {"said": "Describe the sea for me.", "text": None},  # answered without a score: 5 of 5 missing
            {"said": None, "text": "not a scripted turn"}]  # no reference: not counted
    assert agent_words_wer(rows) == {"wer": round(7 / 16, 3), "words": 16}
    assert agent_words_wer([{"said": "yes", "text": "yes"}]) == {"wer": 0.0, "words": 1}
    assert agent_words_wer([]) == {"wer": None, "words": 0}
