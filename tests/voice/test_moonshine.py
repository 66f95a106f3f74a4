"""The Moonshine recognizer (``voice/moonshine_asr.py``): the model shipped in the moonshine-cpp
wheel, loaded without any download, transcribes eSpeak speech word for word (held-out sentences
of ``execstate bench asr``, where PocketSphinx's general model gets most words wrong), through the
stream contract the server uses (40 ms chunks, partials in the background, the final)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from voice_helpers import silence, speech16k

from execstate_bench.asr import transcribe
from execstate_bench.voice_metrics import edit_distance, norm

moonshine_asr = pytest.importorskip("execstate.voice.moonshine_asr")

_asr = None


def asr():
    global _asr
    if _asr is None:
        _asr = moonshine_asr.Moonshine()
    return _asr


HELD_OUT = [("can you remind me to call my sister at six tonight", "en-us", 140),
            ("is it going to rain tomorrow morning", "en-us+m3", 185)]


def _utterance(text: str, voice: str, rate: int) -> np.ndarray:
    return np.concatenate([silence(0.3), speech16k(text, voice, rate), silence(0.3)])


@pytest.mark.parametrize(("text", "voice", "rate"), HELD_OUT)
def test_held_out_sentences_are_transcribed(text, voice, rate):
    """The whole utterance at once. Moonshine's words on the same audio are not the same in every
    process on this machine: alone it gives these two word for word; inside a whole-suite CI run
    it gave "... at 6 to night" once, and "... six tonight" without the final mark another time.
    So at most two words may differ; a recognizer that does not work gets most of them wrong."""
    whole = asr().submit(_utterance(text, voice, rate)).result()
    assert whole[:1].isupper()  # Moonshine capitalises (its final mark is not a promise)
    assert edit_distance(norm(whole), norm(text)) <= 2, whole


def test_streamed_held_out_sentences_word_error_rate():
    """Streamed, an utterance is transcribed in pieces cut at its pauses, and which audio each
    transcription covers depends on the worker's timing: a cut inside a word is misheard ("is it
    going to rain to my room" for a cut inside "tomorrow"). Once, in a whole-suite run on this
    machine, one of these two came out "Is it going to rain to my role modeling?" (not
    reproduced in over 90 streamed runs since, under load or not, fed fast or in time), so the
    promise is the bench's: a word error rate, here over both sentences (4 of 17 words wrong
    that time)."""
    errors = words = 0
    for text, voice, rate in HELD_OUT:
        got = norm(transcribe(asr(), _utterance(text, voice, rate)))
        errors += edit_distance(got, norm(text))
        words += len(norm(text))
    assert errors / words <= 0.25, (errors, words)


def test_the_stream_gives_partials_while_fed_and_its_final_after():
    s = asr().open()
    with pytest.raises(RuntimeError, match="feed before start"):
        s.feed(silence(0.1))
    s.start(0)
    text = "is it going to rain tomorrow morning"
    audio = np.concatenate([silence(0.3), speech16k(text, "en-us+m3", 185), silence(0.5)])
    partials = []
    for i in range(0, len(audio), 640):
        p = s.feed(audio[i:i + 640])
        if p is not None:
            partials.append(p)
        time.sleep(0.04)  # in real time, as the server receives it: the worker transcribes meanwhile
    deadline = time.monotonic() + 10
    while not partials and time.monotonic() < deadline:  # the pause's transcription, on a slow machine
        p = s.feed(silence(0.04))
        if p is not None:
            partials.append(p)
        time.sleep(0.04)
    final = s.finish()
    assert edit_distance(norm(final), norm(text)) <= 2, final  # at most two words (test above)
    assert partials and edit_distance(norm(partials[-1]), norm(text)) <= 2  # the pause's transcription
    assert s.finish() == ""  # one final per utterance
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.start(0)


def test_silence_gives_an_empty_or_short_final():
    s = asr().open()
    s.start(0)
    s.feed(silence(1.0))
    assert len(norm(s.finish())) <= 1


def test_pieces_are_joined_into_one_sentence():
    join = moonshine_asr.join_pieces
    assert join(["Quick question.", "What is 29 times 84?"]) == "Quick question what is 29 times 84?"
    assert join(["I was thinking,", "I wonder?", "", "About them."]) == "I was thinking I wonder about them."
    assert join(["Tell me about", "NASA instead."]) == "Tell me about NASA instead."  # an acronym keeps its capitals
    assert join([]) == "" and join(["Yes."]) == "Yes."


class _Counting:
    """The recognizer with a log of what each transcription was given (start sample, samples)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.gap_s, self.min_piece_s, self.max_piece_s = inner.gap_s, inner.min_piece_s, inner.max_piece_s

    def submit(self, samples):
        self.calls.append(len(samples))
        return self.inner.submit(samples)


def test_an_utterance_with_pauses_is_transcribed_in_pieces_and_its_final_is_the_last_one():
    """Two phrases and a pause between them, streamed in real time: the first phrase becomes a
    piece at the pause, the second is transcribed once the speech pauses at its end, and the final
    is that text (no transcription of the whole utterance at the end)."""
    a, b = "can you remind me to call my sister", "is it going to rain tomorrow morning"
    first, second = speech16k(a, "en-us", 140), speech16k(b, "en-us+m3", 185)
    audio = np.concatenate([silence(0.3), first, silence(0.25), second, silence(1.0)])
    rec = _Counting(asr())
    s = moonshine_asr.MoonshineStream(rec)
    s.start(0)
    for i in range(0, len(audio), 640):
        s.feed(audio[i:i + 640])
        time.sleep(0.04)
    n = len(rec.calls)
    final = s.finish()
    assert len(rec.calls) == n  # the final was ready: the transcription at the last pause covered it
    assert edit_distance(norm(final), norm(f"{a} {b}")) <= 1  # a piece hears less context
    # the last transcription was of the second phrase only (from the first pause on), not the whole
    assert rec.calls[-1] < len(second) + 0.25 * 16000 + 0.2 * 16000 < len(audio) / 2
    s.close()


def test_a_repeated_phrase_is_said_once():
    f = moonshine_asr.without_repeats
    assert f("Can you remind me? Can you remind me?") == "Can you remind me?"
    assert f("Tell me, tell me about the sea.") == "Tell me about the sea."
    assert f("a b c a b c a b c") == "a b c"
    assert f("very very good") == "very very good"  # one word said twice is speech, not a repeat
    assert f("what is 12 times 12") == "what is 12 times 12" and f("") == ""


class _Instant:
    """A recognizer stand-in for the stream's scheduling (no model): each transcription is done at
    once and reads ``<its length in samples>``."""

    gap_s, min_piece_s, max_piece_s, context_gap_s, context_s = 0.08, 2.0, 4.0, 0.6, 3.0

    def __init__(self):
        self.calls = []

    def submit(self, samples):
        from concurrent.futures import Future

        self.calls.append(len(samples))
        f = Future()
        f.set_result(f"<{len(samples)}>")
        return f


def _loud(seconds, amplitude=3000):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(int(seconds * 16000)) * amplitude).astype(np.int16)


def _feed(stream, audio):
    for i in range(0, len(audio), 320):
        stream.feed(audio[i:i + 320])


def test_a_short_phrase_after_a_pause_is_transcribed_again_with_the_last_piece():
    rec = _Instant()
    s = moonshine_asr.MoonshineStream(rec)
    s.start(0)
    _feed(s, np.concatenate([_loud(2.5), silence(0.2)]))  # 2.5 s then a pause: a piece
    assert len(rec.calls) == 1 and 2.58 * 16000 <= rec.calls[0] <= 2.62 * 16000
    _feed(s, np.concatenate([_loud(0.5), silence(0.3)]))  # 0.5 s alone is short: with the piece again
    assert len(rec.calls) == 2 and rec.calls[1] > rec.calls[0] + 0.5 * 16000
    final = s.finish()
    assert len(rec.calls) == 2 and final == f"<{rec.calls[1]}>"  # one text: the merged piece, no new work


def test_long_speech_without_a_pause_is_cut_in_its_quietest_block():
    rec = _Instant()
    s = moonshine_asr.MoonshineStream(rec)
    s.start(0)
    dip = 3 * 16000 // 512  # a quieter (still loud) 32 ms block 3 s in
    audio = _loud(5.0)
    audio[dip * 512:(dip + 1) * 512] //= 6
    _feed(s, audio)
    assert rec.calls[0] == dip * 512 + 256  # the piece ends in the middle of that block
    _feed(s, silence(0.3))
    final = s.finish()
    assert final == f"<{rec.calls[0]}> <{rec.calls[-1]}>" and len(rec.calls) == 2
    assert rec.calls[-1] < len(audio) - rec.calls[0] + 0.3 * 16000  # only the rest, not the whole


class _Words(_Instant):
    """A stand-in that hears words: each loud stretch of the audio is one word, chosen by its
    loudness (``_loud(s, 1000 * k)`` is ``WORDS[k]``); the text ends with a period."""

    WORDS = {1: "tell", 2: "me", 3: "about", 4: "trains"}

    def submit(self, samples):
        from concurrent.futures import Future

        self.calls.append(len(samples))
        x = samples[:len(samples) // 512 * 512].reshape(-1, 512).astype(np.float64)
        rms = np.sqrt((x * x).mean(axis=1))
        words, peak = [], 0.0
        for r in [*rms, 0.0]:
            if r > 300:
                peak = max(peak, r)
            elif peak:
                words.append(self.WORDS[round(peak / 1000)])
                peak = 0.0
        f = Future()
        f.set_result(" ".join(words).capitalize() + "." if words else "")
        return f


def _utter(stream, at, *words):
    """One utterance starting at ``at`` (input samples): 0.1 s of quiet, the words (0.5 s each,
    0.1 s apart), 0.3 s of quiet; returns its final and where it ended."""
    stream.start(at)
    parts = [silence(0.1)]
    for k in words:
        parts += [_loud(0.5, 1000 * k), silence(0.1)]
    audio = np.concatenate([*parts, silence(0.2)])
    _feed(stream, audio)
    return stream.finish(), at + len(audio)


def test_an_utterance_right_after_another_is_heard_with_it_and_gives_its_own_words():
    rec = _Words()
    s = moonshine_asr.MoonshineStream(rec)
    first, end = _utter(s, 0, 1, 2)
    assert first == "Tell me." and s.heard is None
    second, _ = _utter(s, end + int(0.3 * 16000), 3, 4)  # 0.3 s later: within context_gap_s
    assert second == "about trains."  # its own words, for its transcript
    assert s.heard == (0, "Tell me about trains.")  # what the listener takes for both
    assert rec.calls[-1] > 2.0 * 16000  # the transcription read the first utterance's speech too


def test_no_context_after_a_longer_gap_or_once_the_turn_ended():
    rec = _Words()
    s = moonshine_asr.MoonshineStream(rec)
    _, end = _utter(s, 0, 1, 2)
    second, end = _utter(s, end + int(0.7 * 16000), 3, 4)  # 0.7 s > context_gap_s
    assert second == "About trains." and s.heard is None and rec.calls[-1] < 1.6 * 16000
    s.end_context()  # from another thread in the server: a flag read at start
    third, _ = _utter(s, end, 2)
    assert third == "Me." and s.heard is None


def test_the_context_keeps_at_most_context_s_of_the_latest_speech():
    rec = _Words()
    rec.context_s = 1.5  # one earlier utterance of two words fits (about 1.3 s of its speech), not two
    s = moonshine_asr.MoonshineStream(rec)
    _, end = _utter(s, 0, 1, 2)
    second_at = end + 1600
    _, end = _utter(s, second_at, 3)
    third, _ = _utter(s, end + 1600, 4)
    assert third == "trains." and s.heard == (second_at, "About trains.")
