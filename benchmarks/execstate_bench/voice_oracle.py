"""The oracle recognizer of ``execstate bench voice``: the script's own words at the real ASR's timing.

``OracleRecognizer(real)`` wraps a real recognizer: every stream call runs the real one on the same
audio (so the work, and the time it takes, are the real ASR's), but the text it returns is the
script's. The bench's client tells it where each utterance sits in the input stream
(``place(at_sample, utterance)``, at 16 kHz, before the audio is sent); a partial is the script's
words whose audio has been fed, the final the words whose audio ended inside the segment, with
their punctuation
(so a question's final ``?`` ends a sentence, as a recognizer with punctuation would say).
Thread-safe: the client places utterances on its loop while the agent's input worker reads them.
"""

from __future__ import annotations

import threading

import numpy as np

from execstate.voice.interfaces import Recognizer, RecognizerStream


class OracleRecognizer:
    sample_rate = 16000

    def __init__(self, real: Recognizer) -> None:
        self.real = real
        self._words: list[tuple[int, int, str]] = []  # absolute (start, end, word), in order
        self._taken = 0  # words before this one were given to a final transcript
        self._lock = threading.Lock()

    def place(self, at: int, words: tuple[tuple[int, int, str], ...]) -> None:
        with self._lock:
            self._words += [(at + s, at + e, w) for s, e, w in words]

    def partial(self, end: int) -> str:
        """The words not yet in a final transcript whose audio ended before ``end``."""
        with self._lock:
            return " ".join(w for _s, e, w in self._words[self._taken:] if e <= end)

    def final(self, end: int) -> str:
        """The words not yet in a final transcript whose audio ended before ``end`` (100 ms of
        slack): a word the segment cut is left to the next segment, as a recognizer that has not
        heard its end would. Each word is in exactly one final."""
        with self._lock:
            ws = [w for _s, e, w in self._words[self._taken:] if e <= end + 1600]
            self._taken += len(ws)
        return " ".join(ws)

    def open(self) -> RecognizerStream:
        return _OracleStream(self, self.real.open())


class _OracleStream:
    def __init__(self, oracle: OracleRecognizer, real: RecognizerStream) -> None:
        self.oracle, self.real = oracle, real
        self.start_at = 0
        self.pos = 0
        self._last = ""

    def start(self, at_sample: int) -> None:
        self.real.start(at_sample)
        self.start_at = self.pos = at_sample

    def feed(self, samples: np.ndarray) -> str | None:
        self.real.feed(samples)
        self.pos += len(samples)
        text = self.oracle.partial(self.pos)
        if text == self._last:
            return None
        self._last = text
        return text

    def finish(self) -> str:
        self.real.finish()
        return self.oracle.final(self.pos)

    def close(self) -> None:
        self.real.close()
