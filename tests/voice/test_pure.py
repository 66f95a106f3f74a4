"""The voice front's pure parts: server VAD segmentation, playback clock, phrase chunking, numbers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.voice.numbers import number_words, words_to_digits
from execstate.voice.phrases import PhraseChunker
from execstate.voice.playback import PlaybackClock
from execstate.voice.vad import Started, Stopped, VadConfig, VadSegmenter

F = 512  # samples per frame


def segments(probs: list[float], cfg: VadConfig) -> list[Started | Stopped]:
    s = VadSegmenter(cfg)
    out = [ev for p in probs for ev in s.push(p)]
    return out + s.flush()


def test_vad_knobs() -> None:
    cfg = VadConfig(threshold=0.5, prefix_padding_ms=64, silence_duration_ms=96)  # 2 and 3 frames
    probs = [0.0] * 10 + [0.9] * 5 + [0.4] * 2 + [0.9] + [0.1] * 2 + [0.9] + [0.0] * 3 + [0.0] * 5
    ev = segments(probs, cfg)
    # speech from frame 10; 0.4 is above threshold - hysteresis (0.35): still speech; two silent
    # frames (64 ms) do not end it; three do: speech ended after frame 20
    assert ev == [Started(10 * F, 8 * F), Stopped(21 * F, 21 * F + 1536)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), max_size=300), st.floats(0.05, 0.95), st.integers(0, 500), st.integers(0, 500))
def test_vad_invariants(probs, threshold, pad, silence) -> None:
    cfg = VadConfig(threshold=threshold, prefix_padding_ms=pad, silence_duration_ms=silence)
    ev = segments(probs, cfg)
    assert all(isinstance(e, Started if i % 2 == 0 else Stopped) for i, e in enumerate(ev))
    starts, stops = ev[0::2], ev[1::2]
    assert len(starts) == len(stops)
    for a, b in zip(starts, stops, strict=True):
        assert 0 <= a.audio_start <= a.speech_start < b.speech_end <= b.audio_end
    for b, a in zip(stops, starts[1:], strict=False):
        assert b.speech_end <= a.speech_start  # no overlap
    for i, p in enumerate(probs):  # every frame above the threshold is inside a segment
        if p >= threshold:
            assert any(a.speech_start <= i * F < b.speech_end for a, b in zip(starts, stops, strict=True))


def test_vad_config_bounds() -> None:
    for bad in ({"threshold": 0.0}, {"threshold": 1.0}, {"silence_duration_ms": -1}, {"prefix_padding_ms": 10**6},
                {"silence_duration_ms": True}):
        with pytest.raises(ValueError):
            VadConfig(**bad)


def test_playback_clock() -> None:
    c = PlaybackClock(1000)
    c.send(500, 0.0)
    assert c.position(0.2) == 200 and c.buffered(0.2) == 300
    c.pause(0.3)
    assert c.position(1.0) == 300 and c.audible(1.0)
    c.resume(1.0)
    assert c.position(1.1) == 400
    assert c.position(5.0) == 500 and not c.audible(5.0)  # caught up: an underrun
    c.send(100, 6.0)  # playback restarts when audio arrives
    assert c.position(6.05) == 550
    c.pause(6.05)
    assert c.clear(6.1) == 550 and c.sent == 550 and not c.paused and not c.audible(7.0)
    with pytest.raises(ValueError):
        c.position(1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab ,.?\n", max_size=8), max_size=30), st.integers(1, 4))
def test_phrases_cover_the_text(deltas, min_words) -> None:
    ch = PhraseChunker(min_words=min_words)
    pieces = [p for d in deltas for p in ch.push(d)] + ch.end()
    text = "".join(deltas)
    assert "".join(p for _, p in pieces) == text
    pos = 0
    for start, piece in pieces:
        assert start == pos and piece
        pos += len(piece)


def test_phrases_wait_for_whole_words() -> None:
    ch = PhraseChunker(min_words=3, first_words=1)
    assert ch.push(" Once up") == [(0, " Once")]  # the first word goes at once
    assert ch.push("on a") == []  # "upon" and "a": fewer than 3 whole words
    assert ch.push(" time there") == [(5, " upon a time")]
    assert ch.push(", and") == [(17, " there,")]  # a clause ended
    assert ch.end() == [(24, " and")]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**9 - 1))
def test_numbers_round_trip(n) -> None:
    assert words_to_digits(number_words(n)) == str(n)


@pytest.mark.parametrize("text,want", [
    ("what is seventeen times twenty three", "what is 17 times 23"),
    ("the answer is three hundred and ninety one.", "the answer is 391."),
    ("a hundred cats and two dogs", "a 100 cats and 2 dogs"),
    ("no numbers here", "no numbers here"),
])
def test_words_to_digits(text, want) -> None:
    assert words_to_digits(text) == want


def test_vad_ends_early_at_a_sentence_end() -> None:
    cfg = VadConfig(silence_duration_ms=320, sentence_end_silence_ms=64)  # 10 and 2 frames
    s = VadSegmenter(cfg)
    for p in [0.0, 0.9, 0.9, 0.0]:
        assert not [e for e in s.push(p) if isinstance(e, Stopped)]
    assert s.silence == F and s.end_early() is None  # one silent frame: not yet
    s.push(0.0)
    assert s.end_early() == Stopped(3 * F, 5 * F) and not s.in_speech
    assert VadSegmenter(VadConfig(sentence_end_silence_ms=None)).end_early() is None
