"""The speech turn policy (pure): pauses, the sentence-end cue, bursts, barge-in, resume."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.agent.speech_turns import Decision, SpeechTurnConfig, SpeechTurnPolicy

CFG = SpeechTurnConfig(end_of_turn_silence_s=0.8, backchannel_max_s=0.8, backchannel_max_words=2, resume_after_s=0.4)


def segment(p: SpeechTurnPolicy, t0: float, t1: float, speaking: bool = False, words: int = 0,
            silence: float = 0.2) -> list[Decision]:
    out = [p.on_speech_start(t0, speaking)]
    t = t0
    while t < t1:
        t = min(t + 0.032, t1)
        out.append(p.on_speech(t, t - t0, words))
    p.on_speech_stop(t1 + silence, silence)
    return out


def test_pause_does_not_take_the_turn_then_silence_does() -> None:
    p = SpeechTurnPolicy(CFG)
    segment(p, 0.0, 1.0)
    p.on_transcript(False)  # "what is seventeen" (no sentence end)
    assert p.on_tick(1.5) is Decision.NONE  # a 0.5 s pause
    segment(p, 1.5, 2.5)
    assert p.on_tick(2.8) is Decision.NONE  # the second segment's transcript is not in
    p.on_transcript(False)
    assert p.next_deadline() == pytest.approx(3.3)
    assert p.on_tick(3.29) is Decision.NONE
    assert p.on_tick(3.31) is Decision.END_OF_TURN
    assert not p.user_turn_open


def test_sentence_end_ends_the_turn_at_speech_stop() -> None:
    p = SpeechTurnPolicy(CFG)
    segment(p, 0.0, 1.0)
    p.on_transcript(True)  # "what is seventeen times twenty three?"
    assert p.on_tick(1.2) is Decision.END_OF_TURN


def test_burst_holds_then_barges_in_by_length_or_words() -> None:
    p = SpeechTurnPolicy(CFG)
    d = segment(p, 0.0, 0.5, speaking=True)
    assert d[0] is Decision.HOLD and Decision.BARGE_IN not in d and p.burst_open
    assert p.on_tick(0.89) is Decision.NONE
    assert p.on_tick(0.9) is Decision.RESUME  # 0.4 s after the burst's speech ended (0.5 s)
    p2 = SpeechTurnPolicy(CFG)
    d = segment(p2, 0.0, 1.0, speaking=True)
    assert d.count(Decision.BARGE_IN) == 1 and p2.user_turn_open and p2.turn_segment
    p3 = SpeechTurnPolicy(CFG)
    assert p3.on_speech_start(0.0, True) is Decision.HOLD
    assert p3.on_speech(0.3, 0.3, 3) is Decision.BARGE_IN  # three words


def test_no_interrupt_and_no_pause() -> None:
    p = SpeechTurnPolicy(SpeechTurnConfig(interrupt=False))
    d = segment(p, 0.0, 3.0, speaking=True, words=9)
    assert d[0] is Decision.BACKCHANNEL and Decision.BARGE_IN not in d
    p = SpeechTurnPolicy(SpeechTurnConfig(pause_on_speech=False))
    assert p.on_speech_start(0.0, True) is Decision.BACKCHANNEL


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 2.0), st.floats(0.1, 3.0), st.booleans(), st.integers(0, 6)),
                min_size=1, max_size=8))
def test_every_burst_resolves_once(segs) -> None:
    """Each burst ends exactly once: as a barge-in or a resume; pauses shorter than the
    end-of-turn silence never end a turn whose text does not end a sentence."""
    p = SpeechTurnPolicy(CFG)
    t, bursts, resolved = 0.0, 0, 0
    for gap, length, speaking, words in segs:
        t += gap
        was_burst = not p.user_turn_open and speaking
        d = segment(p, t, t + length, speaking=speaking, words=words)
        bursts += was_burst
        resolved += d.count(Decision.BARGE_IN)
        if p.turn_segment:
            p.on_transcript(False)
        t += length + 0.2
        for k in range(1, 200):
            d2 = p.on_tick(t + 0.01 * k)
            if d2 is Decision.END_OF_TURN:
                assert t + 0.01 * k - (p.last_speech_t or 0) >= CFG.end_of_turn_silence_s - 1e-9
            resolved += d2 is Decision.RESUME
        t += 2.0
    assert resolved == bursts


def test_config_bounds() -> None:
    for bad in ({"end_of_turn_silence_s": 0}, {"backchannel_max_words": -1}, {"resume_after_s": 100},
                {"backchannel_max_s": True}):
        with pytest.raises(ValueError):
            SpeechTurnConfig(**bad)


def test_a_burst_adds_up_over_its_segments() -> None:
    """Speech split by short silences into several segments is one burst: its speech and words add
    up to a barge-in (no segment alone would), and only the first segment holds."""
    p = SpeechTurnPolicy(CFG)
    assert p.on_speech_start(0.0, True) is Decision.HOLD
    assert p.on_speech(0.5, 0.5, 2) is Decision.NONE
    p.on_speech_stop(0.7, 0.2)
    assert p.on_tick(0.75) is Decision.NONE  # not yet resume_after_s (0.4 s) of quiet
    assert p.on_speech_start(0.8, True) is Decision.NONE  # the same burst goes on
    assert p.on_speech(1.0, 0.2, 0) is Decision.NONE
    assert p.on_speech(1.2, 0.4, 1) is Decision.BARGE_IN  # 0.9 s > 0.8 s (and 3 words > 2)
    assert p.user_turn_open and not p.burst_open


SEMANTIC = SpeechTurnConfig(end_of_turn_silence_s=1.0, end_threshold=0.35, semantic_silence_s=0.2)


def test_a_high_end_score_ends_the_turn_after_the_short_silence() -> None:
    p = SpeechTurnPolicy(SEMANTIC)
    segment(p, 0.0, 1.0, silence=0.15)  # last speech at 1.0, stopped at 1.15
    p.on_transcript(False)
    p.on_end_score(0.6)  # "describe the sea for me"
    assert p.next_deadline() == pytest.approx(1.2)
    assert p.on_tick(1.19) is Decision.NONE
    assert p.on_tick(1.21) is Decision.END_OF_TURN
    assert p.end_score is None


def test_a_low_end_score_waits_the_long_silence_and_new_speech_drops_the_score() -> None:
    p = SpeechTurnPolicy(SEMANTIC)
    segment(p, 0.0, 1.0)
    p.on_transcript(False)
    p.on_end_score(0.05)  # "tell me a long"
    assert p.next_deadline() == pytest.approx(2.0 - 0.8 * 0.05 / 0.35)  # nearly the long silence
    assert p.on_tick(1.6) is Decision.NONE  # a 0.6 s mid-sentence pause
    segment(p, 1.6, 2.2)
    assert p.end_score is None  # the words changed: the old score is not theirs
    p.on_transcript(False)
    p.on_end_score(0.5)
    assert p.on_tick(2.45) is Decision.END_OF_TURN


def test_without_the_graded_wait_a_score_below_the_threshold_waits_the_long_silence() -> None:
    """The end-of-turn probe's rule: 0.49 against 0.5 waits as long as no score at all."""
    p = SpeechTurnPolicy(SpeechTurnConfig(end_of_turn_silence_s=1.0, end_threshold=0.5, semantic_silence_s=0.2,
                                          graded_wait=False))
    segment(p, 0.0, 1.0)
    p.on_transcript(False)
    p.on_end_score(0.49)
    assert p.next_deadline() == pytest.approx(2.0)
    assert p.on_tick(1.9) is Decision.NONE
    p.on_end_score(0.5)
    assert p.next_deadline() == pytest.approx(1.2)
    assert p.on_tick(1.91) is Decision.END_OF_TURN
    with pytest.raises(ValueError, match="graded_wait"):
        SpeechTurnConfig(graded_wait=1)  # type: ignore[arg-type]


def test_without_a_threshold_scores_change_nothing() -> None:
    p = SpeechTurnPolicy(CFG)
    segment(p, 0.0, 1.0)
    p.on_transcript(False)
    p.on_end_score(0.99)
    assert p.on_tick(1.5) is Decision.NONE and p.on_tick(1.81) is Decision.END_OF_TURN


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, True, "0.5"])
def test_a_bad_end_threshold_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="end_threshold"):
        SpeechTurnConfig(end_threshold=bad)


def test_under_semantic_rules_a_final_mark_alone_does_not_end_the_turn() -> None:
    p = SpeechTurnPolicy(SEMANTIC)
    segment(p, 0.0, 1.0)
    p.on_transcript(True)  # "Could you tell me something nice." (a punctuating recognizer, cut off)
    assert p.on_tick(1.3) is Decision.NONE  # no score yet: the long silence
    p.on_end_score(0.0)  # the model: not over
    assert p.on_tick(1.99) is Decision.NONE and p.on_tick(2.01) is Decision.END_OF_TURN


def test_the_silence_counts_from_the_last_speech_frame_not_from_the_vads_stop() -> None:
    """Progress during the VAD's trailing silence says how long it has been silent: a well-scored
    turn ends once that reaches the short silence, when the segment stops (not 0.2 s later)."""
    p = SpeechTurnPolicy(SEMANTIC)
    assert p.on_speech_start(0.0, False) is Decision.NONE
    p.on_speech(0.5, 0.5, 3)
    p.on_speech(0.6, 0.5, 3, silence_s=0.1)  # the speech ended at 0.5
    p.on_speech(0.62, 0.5, 3, silence_s=0.16)  # an early report (the input was processed late): not moved back
    p.on_speech_stop(0.72, 0.2)  # the VAD's 200 ms: the speech ended at 0.52 by this report
    p.on_transcript(True)
    p.on_end_score(0.6)
    assert p.next_deadline() == pytest.approx(0.72)  # before: 0.82 (0.2 s after the last report)
    assert p.on_tick(0.7205) is Decision.END_OF_TURN
    q = SpeechTurnPolicy(SEMANTIC)  # a low score: the long silence, from the speech's end too
    q.on_speech_start(0.0, False)
    q.on_speech(0.6, 0.5, 3, silence_s=0.1)
    q.on_speech_stop(0.72, 0.2)
    q.on_transcript(False)
    q.on_end_score(0.0)
    assert q.on_tick(1.51) is Decision.NONE and q.on_tick(1.53) is Decision.END_OF_TURN


def test_the_silence_a_turn_needs_falls_with_its_end_score() -> None:
    """Below the threshold the wait shrinks linearly from the long silence (score 0) to the short one."""
    for score, wait in ((None, 1.0), (0.0, 1.0), (0.175, 0.6), (0.3, 1.0 - 0.8 * 0.3 / 0.35), (0.35, 0.2), (0.9, 0.2)):
        p = SpeechTurnPolicy(SEMANTIC)
        segment(p, 0.0, 1.0)
        p.on_transcript(False)
        p.on_end_score(score)
        assert p.next_deadline() == pytest.approx(1.0 + wait)
        if wait > 0.21:  # the segment stopped at 1.2
            assert p.on_tick(1.0 + wait - 0.005) is Decision.NONE
        assert p.on_tick(1.0 + wait + 0.005) is Decision.END_OF_TURN
