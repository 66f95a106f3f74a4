"""Server VAD: speech segments from per-frame speech probabilities (pure Python, no model).

The knobs are OpenAI Realtime's ``turn_detection: {type: "server_vad"}`` ones:

- ``threshold``: a frame with probability >= threshold is speech; speech *ends* below
  ``threshold - hysteresis`` (Silero's own rule, so a word's soft tail does not split it);
- ``prefix_padding_ms``: audio kept before the first speech frame (the segment sent to the
  recognizer starts that much earlier);
- ``silence_duration_ms``: silence after the last speech frame that ends the segment;
- ``sentence_end_silence_ms`` (this server's, like OpenAI's ``semantic_vad``): the shorter silence
  that ends it when the caller says the words so far end a sentence (``end_early``; None: never).

``push(p)`` takes the next frame's probability and returns the events it causes, in order:
:class:`Started` (at the first speech frame: ``speech_start`` its first sample, ``audio_start``
that minus the padding, clamped at the stream start) and :class:`Stopped` (once the silence
reached ``silence_duration_ms``: ``speech_end`` one past the last speech sample, ``audio_end``
that plus the silence). Positions are samples since the stream began. While a segment is open,
``speech_samples`` counts its speech frames' samples and ``last_speech_end`` is where its latest
speech frame ended (what the turn policy measures bursts and silences with). ``flush()`` ends an
open segment (the stream stopped). Invariants (tested): segments alternate Started/Stopped, do
not overlap, and every speech frame lies inside one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VadConfig:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 200
    sentence_end_silence_ms: int | None = 100
    hysteresis: float = 0.15
    sample_rate: int = 16000
    frame_samples: int = 512

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold!r}")
        for name in ("prefix_padding_ms", "silence_duration_ms", "sentence_end_silence_ms"):
            v = getattr(self, name)
            if v is None and name == "sentence_end_silence_ms":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10_000:
                raise ValueError(f"{name} must be an integer in [0, 10000], got {v!r}")

    def samples(self, ms: int) -> int:
        return ms * self.sample_rate // 1000


@dataclass(frozen=True)
class Started:
    speech_start: int
    audio_start: int


@dataclass(frozen=True)
class Stopped:
    speech_end: int
    audio_end: int


class VadSegmenter:
    def __init__(self, config: VadConfig | None = None) -> None:
        self.config = config or VadConfig()
        self.position = 0  # samples pushed so far
        self.in_speech = False
        self.speech_samples = 0
        self.last_speech_end = 0
        self._silence_after: int | None = None  # where the current silence began (in a segment)

    def push(self, p: float) -> list[Started | Stopped]:
        c = self.config
        start, self.position = self.position, self.position + c.frame_samples
        out: list[Started | Stopped] = []
        if not self.in_speech:
            if p >= c.threshold:
                self.in_speech = True
                self.speech_samples = c.frame_samples
                self.last_speech_end = self.position
                self._silence_after = None
                out.append(Started(start, max(0, start - c.samples(c.prefix_padding_ms))))
            return out
        if p >= c.threshold - c.hysteresis:
            self.speech_samples += c.frame_samples
            self.last_speech_end = self.position
            self._silence_after = None
            return out
        if self._silence_after is None:
            self._silence_after = start
        if self.position - self._silence_after >= c.samples(c.silence_duration_ms):
            out.append(self._stop())
        return out

    @property
    def silence(self) -> int:
        """Samples of silence since the last speech frame of the open segment (0: none)."""
        return self.position - self._silence_after if self.in_speech and self._silence_after is not None else 0

    def end_early(self) -> Stopped | None:
        """The words so far end a sentence: end the segment if its silence reached
        ``sentence_end_silence_ms`` (``audio_end``: where it is now)."""
        c = self.config
        if c.sentence_end_silence_ms is None or not self.in_speech or self._silence_after is None:
            return None
        if self.silence < c.samples(c.sentence_end_silence_ms):
            return None
        self.in_speech = False
        self._silence_after = None
        return Stopped(self.last_speech_end, self.position)

    def flush(self) -> list[Stopped]:
        return [self._stop()] if self.in_speech else []

    def _stop(self) -> Stopped:
        c = self.config
        self.in_speech = False
        self._silence_after = None
        return Stopped(self.last_speech_end, self.last_speech_end + c.samples(c.silence_duration_ms))
