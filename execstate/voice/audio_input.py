"""The input side of a voice agent: audio -> speech segments -> transcripts (blocking; one worker).

``AudioInput.process(samples)`` takes the next input audio (int16 at ``in_rate``), resamples it to
16 kHz, runs the speech detector on each 32 ms frame, cuts segments with the server VAD
(``vad.py``; a segment whose hypothesis so far ends a sentence ends after the VAD's shorter
``sentence_end_silence_ms``) and streams each segment to the recognizer (with ``prefix_padding_ms`` of audio
before the first speech frame). It returns what happened, in order, as :class:`InputEvent`s:

    VadStart -> (Progress | Partial)* -> VadStop -> Final        (per segment)

``Progress`` carries the segment's speech so far and the silence since its last speech frame
(seconds), ``Partial`` the recognizer's new hypothesis, ``Final`` the transcript once the segment
ended. ``VadStop`` carries ``speech_end_t``, when the segment's last speech frame ended on
``clock`` (the agent's: ``VoiceAgent`` gives it; None without a clock): the clock when the VAD saw
the stop, before the final was transcribed, less the silence the VAD had heard by then, so however
long the final takes. ``Partial`` and ``Final`` carry ``heard`` when the stream has one (an optional
attribute of a recognizer stream: ``interfaces.py``): the segment transcribed with the segments
just before it, as (where that audio starts, its text). Without VAD (``vad=None``: the client
commits), audio accumulates (at most ``max_buffer_s``, else ValueError) until ``commit()``
recognises it as one segment (``Final``), or ``clear()`` drops it. Positions are 16 kHz samples
since the first input sample.

Every call blocks (resampling, the detector, the recognizer): ``VoiceAgent`` makes them on one
worker thread, in order, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from execstate.voice.interfaces import RecognizerStream, SpeechDetector
from execstate.voice.resample import Resampler
from execstate.voice.vad import Started, Stopped, VadConfig, VadSegmenter

RATE = 16000


@dataclass(frozen=True)
class VadStart:
    speech_start: int
    audio_start: int


@dataclass(frozen=True)
class Progress:
    speech_s: float
    silence_s: float = 0.0  # since the segment's last speech frame (the VAD's trailing silence so far)


@dataclass(frozen=True)
class Partial:
    text: str
    heard: tuple[int, str] | None = None  # (from this sample on, the words): the stream's re-hearing


@dataclass(frozen=True)
class VadStop:
    speech_end: int
    audio_end: int
    speech_end_t: float | None = None  # when the last speech frame ended, on the input's clock (None: none)


@dataclass(frozen=True)
class Final:
    text: str
    audio_start: int
    audio_end: int
    heard: tuple[int, str] | None = None


InputEvent = VadStart | Progress | Partial | VadStop | Final


class AudioInput:
    def __init__(self, detector: SpeechDetector | None, stream: RecognizerStream, vad: VadConfig | None,
                 in_rate: int = RATE, max_buffer_s: float = 120.0, clock: Callable[[], float] | None = None) -> None:
        if vad is not None and detector is None:
            raise ValueError("server VAD needs a speech detector")
        self.detector, self.stream, self.clock = detector, stream, clock
        self.vad = VadSegmenter(vad) if vad is not None else None
        self.resampler = Resampler(in_rate, RATE)
        self.max_buffer = int(max_buffer_s * RATE)
        self.received = 0  # 16 kHz samples received
        self._frame = np.zeros(0, dtype=np.int16)  # samples not yet in a detector frame
        pad = vad.samples(vad.prefix_padding_ms) if vad is not None else 0
        self._recent = np.zeros(0, dtype=np.int16)  # the last prefix_padding_ms before the frame
        self._pad = pad
        self._seg_start = 0
        self._manual: list[np.ndarray] = []
        self._manual_n = 0
        self._partial = ""  # the open segment's latest hypothesis

    def process(self, samples: np.ndarray) -> list[InputEvent]:
        x = self.resampler.process(samples)
        self.received += len(x)
        if self.vad is None:
            if self._manual_n + len(x) > self.max_buffer:
                raise ValueError(f"the input audio buffer holds at most {self.max_buffer // RATE} s; "
                                 "commit or clear it")
            self._manual.append(x)
            self._manual_n += len(x)
            return []
        assert self.detector is not None
        out: list[InputEvent] = []
        buf = np.concatenate([self._frame, x])
        n = self.vad.config.frame_samples
        feed: list[np.ndarray] = []
        for i in range(0, len(buf) - n + 1, n):
            frame = buf[i:i + n]
            for ev in self.vad.push(self.detector.probability(frame)):
                if isinstance(ev, Started):
                    self._flush_feed(feed, out)
                    self._seg_start = ev.audio_start
                    self.stream.start(ev.audio_start)
                    out.append(VadStart(ev.speech_start, ev.audio_start))
                    k = min(ev.speech_start - ev.audio_start, len(self._recent))
                    lead = self._recent[len(self._recent) - k:] if k > 0 else self._recent[:0]
                    if len(lead):
                        feed.append(lead)
                elif isinstance(ev, Stopped):
                    stop = VadStop(ev.speech_end, ev.audio_end, self._speech_end_t(ev.speech_end))
                    feed.append(frame)
                    self._flush_feed(feed, out)
                    out.append(stop)
                    out.append(self._final(ev.audio_end))
                    self._partial = ""
                    frame = frame[:0]
            if self.vad.in_speech and len(frame):
                feed.append(frame)
            self._recent = np.concatenate([self._recent, buf[i:i + n]])[-self._pad:] if self._pad else self._recent
        self._frame = buf[(len(buf) // n) * n:]
        self._flush_feed(feed, out)
        if self.vad.in_speech and self._partial.rstrip()[-1:] in (".", "?", "!"):
            early = self.vad.end_early()  # the words so far end a sentence: a shorter silence ends it
            if early is not None:
                out.append(VadStop(early.speech_end, early.audio_end, self._speech_end_t(early.speech_end)))
                out.append(self._final(early.audio_end))
                self._partial = ""
        if self.vad.in_speech:
            out.append(Progress(self.vad.speech_samples / RATE, self.vad.silence / RATE))
        return out

    def commit(self) -> Final | None:
        """Manual mode: recognise the buffered audio as one segment (None: the buffer is empty)."""
        if self.vad is not None:
            raise ValueError("commit is for manual turn detection (turn_detection: null)")
        if not self._manual_n:
            return None
        start = self.received - self._manual_n
        audio = np.concatenate(self._manual)
        self._manual, self._manual_n = [], 0
        self.end_context()  # each commit is a turn of its own
        self.stream.start(start)
        self.stream.feed(audio)
        return Final(self.stream.finish(), start, self.received)

    def clear(self) -> None:
        """Drop the uncommitted audio (manual) or the segment in progress (VAD: it ends unheard)."""
        self._manual, self._manual_n = [], 0
        if self.vad is not None and self.vad.in_speech:
            self.vad.flush()
            self.stream.finish()

    def close(self) -> None:
        self.stream.close()

    def end_context(self) -> None:
        """The turn is over: a stream that hears segments with the ones before them (``heard``)
        starts the next one without them. Thread-safe where the stream's ``end_context`` is (it may
        be called from the event loop while the worker processes audio)."""
        end = getattr(self.stream, "end_context", None)
        if end is not None:
            end()

    def _speech_end_t(self, speech_end: int) -> float | None:
        """The clock's time of ``speech_end``: now less the audio the VAD heard after it."""
        assert self.vad is not None
        return None if self.clock is None else self.clock() - (self.vad.position - speech_end) / RATE

    def _final(self, audio_end: int) -> Final:
        text = self.stream.finish()
        return Final(text, self._seg_start, audio_end, getattr(self.stream, "heard", None))

    def _flush_feed(self, feed: list[np.ndarray], out: list[InputEvent]) -> None:
        if not feed:
            return
        partial = self.stream.feed(np.concatenate(feed))
        feed.clear()
        if partial is not None:
            self._partial = partial
            out.append(Partial(partial, getattr(self.stream, "heard", None)))
