"""The three engines a voice agent plugs in: a speech detector, a recognizer, a synthesizer.

Each is a small protocol; the defaults are ``silero.SileroVAD``, ``pocketsphinx_asr.PocketSphinx``
and ``espeak.Espeak``. Another engine (for example a Whisper-class recognizer whose model the user
supplies by path) implements the same calls and is handed to ``VoiceAgent``; nothing in the
runtime changes. Contracts (``tests/voice/test_interfaces.py`` checks them on the defaults):

**Threads.** Every call here may block (model inference, C libraries). ``VoiceAgent`` makes every
call from a worker thread, never on the event loop: the calls of one *stream* (a recognizer
stream, a detector) come from one thread at a time, in order. A ``Synthesizer`` may be shared by
several agents: it serialises itself if its library is not reentrant.

**SpeechDetector** (voice activity): ``frame_samples`` samples at ``sample_rate`` (16 kHz) per
call; ``probability(frame)`` is the speech probability of that frame, given every frame before it
(the detector keeps state); ``reset()`` forgets it. Int16 mono in.

**Recognizer** -> ``open()`` a **RecognizerStream** (one per agent; opening may load a model, so it
runs in a worker too). An utterance is ``start(at_sample)`` (where it begins in the agent's input
stream, 16 kHz samples since the stream began), any number of ``feed(samples)`` (16 kHz int16,
consecutive), then ``finish()``. ``feed`` returns the new partial hypothesis when it changed
(else None); ``finish`` returns the final transcript ("" when nothing was recognised). Texts are
plain words (punctuation only where the engine produces it: a final ``.?!`` is taken as the end of
a sentence by the turn policy). ``close()`` frees the stream. Optional: a stream that transcribes
an utterance together with the ones just before it has ``heard``, after ``feed``/``finish``:
None, or (the sample where that audio starts, the text of all of it), while ``feed``/``finish``
return the utterance's own words; ``end_context()`` (any thread) makes its next utterance start
without the earlier ones.

**Synthesizer**: ``sample_rate`` of its output; ``synthesize(text, voice, sink)`` speaks ``text``
and calls ``sink(chunk)`` with each :class:`SynthChunk` as it is produced (in order; the word
marks of a chunk are the words whose audio starts inside it), and stops early when ``sink`` returns
False. ``voices()`` lists the accepted voice names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class WordMark:
    """A word of the synthesised text: characters ``[start, end)`` of the text, its audio starting
    at ``sample`` (from the start of this synthesis, at the synthesizer's rate)."""

    start: int
    end: int
    sample: int


@dataclass(frozen=True)
class SynthChunk:
    samples: np.ndarray  # int16 mono at the synthesizer's sample_rate
    marks: tuple[WordMark, ...] = ()


class SpeechDetector(Protocol):
    sample_rate: int
    frame_samples: int

    def probability(self, frame: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class RecognizerStream(Protocol):
    def start(self, at_sample: int) -> None: ...

    def feed(self, samples: np.ndarray) -> str | None: ...

    def finish(self) -> str: ...

    def close(self) -> None: ...


class Recognizer(Protocol):
    sample_rate: int

    def open(self) -> RecognizerStream: ...


class Synthesizer(Protocol):
    sample_rate: int

    def synthesize(self, text: str, voice: str | None, sink: Callable[[SynthChunk], bool]) -> None: ...

    def voices(self) -> list[str]: ...
