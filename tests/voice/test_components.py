"""The default engines on real synthetic speech: eSpeak NG, Silero VAD, PocketSphinx."""

from __future__ import annotations

import numpy as np
import pytest
from voice_helpers import AGENT_RATE, AGENT_VOICE, recognizer, says_number, silence, speech16k

from execstate.voice.espeak import Espeak
from execstate.voice.numbers import number_words, words_to_digits
from execstate.voice.pcm import rms_dbfs
from execstate.voice.pocketsphinx_asr import PocketSphinx
from execstate.voice.resample import resample
from execstate.voice.silero import SileroVAD
from execstate.voice.vad import VadConfig, VadSegmenter


def test_espeak_streams_chunks_with_word_marks() -> None:
    tts = Espeak(voice="en-us", chunk_ms=40)
    text = "The answer is 391, naïve café."
    chunks = []
    tts.synthesize(text, None, lambda c: chunks.append(c) is None)
    assert len(chunks) > 10 and tts.sample_rate == 22050
    assert all(len(c.samples) <= 0.1 * 22050 for c in chunks)  # small chunks as produced
    marks = [m for c in chunks for m in c.marks]
    assert [text[m.start:m.end] for m in marks] == ["The", "answer", "is", "391", "naïve", "café"]
    starts = [m.sample for m in marks]
    assert starts == sorted(starts) and starts[-1] < sum(len(c.samples) for c in chunks)
    audio = np.concatenate([c.samples for c in chunks])
    assert 2.0 < len(audio) / 22050 < 5.0 and rms_dbfs(audio) > -30


def test_espeak_stops_when_the_sink_says_so() -> None:
    tts = Espeak()
    got = []
    tts.synthesize("one two three four five six seven eight nine ten", None, lambda c: got.append(c) or len(got) < 3)
    assert len(got) == 3
    with pytest.raises(ValueError):
        tts.synthesize("hi", "no-such-voice", lambda c: True)


def test_silero_finds_the_speech() -> None:
    x = np.concatenate([silence(1.0), speech16k("what is seventeen times twenty three"), silence(1.0)])
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 32768 * 10 ** (-40 / 20), len(x))  # -40 dBFS of white noise throughout
    x = np.clip(x + noise, -32768, 32767).astype(np.int16)
    vad, seg = SileroVAD(), VadSegmenter(VadConfig(silence_duration_ms=300))
    events = [ev for i in range(0, len(x) - 511, 512) for ev in seg.push(vad.probability(x[i:i + 512]))]
    assert len(events) == 2  # one segment: the noise is not speech
    start, stop = events
    speech_len = len(x) - 32000
    assert 16000 - 512 <= start.speech_start <= 16000 + 0.15 * 16000
    assert 16000 + speech_len - 0.3 * 16000 <= stop.speech_end <= 16000 + speech_len + 0.1 * 16000


def test_pocketsphinx_streams_partials_and_a_final() -> None:
    s = recognizer().open()
    x = np.concatenate([silence(0.3), speech16k("what is seventeen times twenty three"), silence(0.3)])
    s.start(0)
    partials = [p for i in range(0, len(x), 1600) if (p := s.feed(x[i:i + 1600])) is not None]
    final = s.finish()
    assert len(partials) >= 3 and partials[0].split()[0] == "what"
    assert words_to_digits(final) == "what is 17 times 23"


def test_recognise_a_spoken_number() -> None:
    """What the agent tests check its answers with: a numbers-only recognizer on one number."""
    tts = Espeak(voice=AGENT_VOICE, rate=AGENT_RATE)
    asr = PocketSphinx([number_words(n) for n in range(1000)])
    assert asr.vocabulary is not None and "ninety" in asr.vocabulary and "answer" not in asr.vocabulary
    s = asr.open()
    s.start(0)
    s.feed(np.concatenate([silence(0.3), resample(tts.speak(" 391.")[0], tts.sample_rate, 16000), silence(0.3)]))
    assert says_number(s.finish(), 391)
    with pytest.raises(ValueError):
        PocketSphinx(["qwxzzy"])  # a word without a pronunciation
