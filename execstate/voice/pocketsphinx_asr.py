"""The default recognizer: PocketSphinx 5 (its US English model ships inside the wheel).

``PocketSphinx()`` decodes with the wheel's general English language model (about 0.5 s to open a
stream: the model loads per stream). Its accuracy on synthetic speech is low (the issue measured
36-69 % word error rate on eSpeak voices). ``PocketSphinx(phrases=[...])`` decodes with a small
trigram model built from example phrases instead, over their words only (a constrained
vocabulary, the classic command-and-control setup: opening a stream then takes milliseconds, and
in-domain sentences are recognised far better; out-of-domain speech comes out as the nearest
in-domain words). Streaming: ``feed`` runs the decoder on each chunk and returns the partial
hypothesis when it changed (``RecognizerStream`` contract in ``interfaces.py``). Texts are
lower-case words; alternate pronunciation marks (``word(2)``) and fillers are removed.

Memory: a decoder holds its own copy of the models (about 70 MB with the general model, 10-20 MB
with a phrase model), and building and freeing one per connection, each on its own worker
thread, leaves the freed pages in that thread's allocator arena: a server's RSS grew by that much
per voice connection and never came down. So a ``PocketSphinx`` keeps the decoders of closed
streams (at most ``max_idle``) and ``open`` reuses one, its cepstral mean reset to the model's
initial value, so a stream's transcripts do not depend on the streams before it. The memory is
bounded by the most streams open at once, not by how many were ever opened. ``decoders_built``
counts the decoders made (tests/voice checks the reuse).
"""

from __future__ import annotations

import io
import re
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

_ALT = re.compile(r"\(\d+\)$")


def _decoder_class():
    try:
        from pocketsphinx import Decoder
    except ImportError as exc:
        raise RuntimeError("the PocketSphinx recognizer needs the pocketsphinx package "
                           "(pip install pocketsphinx)") from exc
    return Decoder


def _clean(hyp: str) -> str:
    words = [_ALT.sub("", w) for w in hyp.split()]
    return " ".join(w for w in words if w and not w.startswith(("<", "[", "++")))


class PocketSphinxStream:
    """Audio reaches the decoder in fixed blocks of ``block`` samples whatever the callers' chunk
    sizes, so the transcript depends on the audio only (the decoder's feature normalisation
    updates per block)."""

    def __init__(self, decoder, block: int = 1024, on_close: Callable[[object], None] | None = None) -> None:
        self._d = decoder
        self._block = block
        self._on_close = on_close
        self._pending = np.zeros(0, dtype=np.int16)
        self._open = False
        self._last = ""

    def start(self, at_sample: int) -> None:
        if self._d is None:
            raise RuntimeError("the stream is closed")
        if self._open:
            self._d.end_utt()
        self._d.start_utt()
        self._open, self._last = True, ""
        self._pending = self._pending[:0]

    def feed(self, samples: np.ndarray) -> str | None:
        if not self._open:
            raise RuntimeError("feed before start")
        buf = np.concatenate([self._pending, np.asarray(samples, dtype=np.int16)])
        n = len(buf) // self._block * self._block
        self._pending = buf[n:]
        if n == 0:
            return None
        for i in range(0, n, self._block):
            self._d.process_raw(buf[i:i + self._block].astype("<i2").tobytes(), False, False)
        h = self._d.hyp()
        text = _clean(h.hypstr) if h is not None else ""
        if text == self._last:
            return None
        self._last = text
        return text

    def finish(self) -> str:
        if not self._open:
            return ""
        if len(self._pending):
            self._d.process_raw(self._pending.astype("<i2").tobytes(), False, False)
            self._pending = self._pending[:0]
        self._d.end_utt()
        self._open = False
        h = self._d.hyp()
        return _clean(h.hypstr) if h is not None else ""

    def close(self) -> None:
        """End the utterance in progress and hand the decoder back (idempotent)."""
        if self._d is None:
            return
        if self._open:
            self._d.end_utt()
            self._open = False
        d, self._d = self._d, None
        if self._on_close is not None:
            self._on_close(d)


class PocketSphinx:
    sample_rate = 16000

    def __init__(self, phrases: Iterable[str] | None = None, max_idle: int = 2) -> None:
        self._decoder = _decoder_class()
        self._kwargs: dict[str, object] = {"samprate": self.sample_rate, "loglevel": "FATAL"}
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.vocabulary: set[str] | None = None
        self.max_idle = max_idle
        self.decoders_built = 0
        self._idle: list[tuple[Any, str]] = []  # (a pocketsphinx Decoder: untyped, its initial cepstral mean)
        self._lock = threading.Lock()  # streams open and close on their agents' worker threads
        if phrases is not None:
            self._build(list(phrases))

    def open(self) -> PocketSphinxStream:
        """A stream on an idle decoder (its cepstral mean reset), or on a new one."""
        with self._lock:
            found = self._idle.pop() if self._idle else None
        if found is None:
            d = self._decoder(**self._kwargs)
            found = (d, d.get_cmn())
            with self._lock:
                self.decoders_built += 1
        d, cmn = found
        d.set_cmn(cmn)
        return PocketSphinxStream(d, on_close=lambda dec: self._give_back(dec, cmn))

    def _give_back(self, decoder: object, cmn: str) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append((decoder, cmn))

    def _build(self, phrases: list[str]) -> None:
        from pocketsphinx import get_model_path
        from pocketsphinx.lm import ArpaBoLM

        sents = [" ".join(re.findall(r"[a-z']+", p.lower())) for p in phrases]
        sents = [s for s in sents if s]
        if not sents:
            raise ValueError("phrases: at least one phrase with words")
        words = {w for s in sents for w in s.split()}
        entries, found = [], set()
        with open(Path(get_model_path()) / "en-us" / "cmudict-en-us.dict", encoding="utf-8") as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                base = _ALT.sub("", head)
                if base in words:
                    entries.append(line if line.endswith("\n") else line + "\n")
                    found.add(base)
        missing = sorted(words - found)
        if missing:
            raise ValueError(f"phrases: words not in the pronunciation dictionary: {missing[:10]}")
        lm = ArpaBoLM(text="\n".join(sents), add_start=True)
        lm.compute()
        buf = io.StringIO()
        lm.write(buf)
        self._dir = tempfile.TemporaryDirectory(prefix="execstate-asr-")
        arpa, dic = Path(self._dir.name) / "phrases.arpa", Path(self._dir.name) / "phrases.dict"
        arpa.write_text(buf.getvalue(), encoding="utf-8")
        dic.write_text("".join(entries), encoding="utf-8")
        self._kwargs.update(lm=str(arpa), dict=str(dic))
        self.vocabulary = words
