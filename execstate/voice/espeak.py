"""The default synthesizer: eSpeak NG through ctypes, from the ``espeakng-loader`` wheel.

The wheel ships ``libespeak-ng`` and its voice data, so nothing is looked up on the system. The
library keeps global state (one voice, one callback per process), so every synthesis holds one
process-wide lock; a synthesis of a phrase takes about a millisecond per second of speech.
Synchronous mode: ``espeak_Synth`` returns when the phrase is done, calling the callback with
chunks of ``chunk_ms`` as they are produced (``Synthesizer`` contract in ``interfaces.py``). Word
events give each word's character range and first sample, which is how a played position maps
back to text (truncation by what was played).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from execstate.voice.interfaces import SynthChunk, WordMark

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_EVENT_LIST_TERMINATED, _EVENT_WORD = 0, 1
_RATE, _PITCH = 1, 3


class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_char * 8)]


_Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


class _Library:
    """The loaded library (one per process: its state is global)."""

    lock = threading.Lock()
    _lib: ctypes.CDLL | None = None
    rate = 0

    @classmethod
    def get(cls, chunk_ms: int) -> tuple[ctypes.CDLL, int]:
        with cls.lock:
            if cls._lib is None:
                try:
                    import espeakng_loader
                except ImportError as exc:
                    raise RuntimeError("the espeak synthesizer needs the espeakng-loader package "
                                       "(pip install espeakng-loader)") from exc
                lib = ctypes.CDLL(espeakng_loader.get_library_path())
                lib.espeak_Initialize.restype = ctypes.c_int
                lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                             ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
                root = os.path.dirname(espeakng_loader.get_data_path())
                rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, chunk_ms, root.encode(), _INITIALIZE_DONT_EXIT)
                if rate <= 0:
                    raise RuntimeError(f"espeak_Initialize failed ({rate})")
                cls._lib, cls.rate = lib, rate
            return cls._lib, cls.rate


class Espeak:
    """``Synthesizer`` over eSpeak NG. ``voice``: an eSpeak voice name (``en-us``, ``en+f3``, ...);
    ``rate``: words per minute; ``pitch``: 0-99."""

    def __init__(self, voice: str = "en-us", rate: int = 170, pitch: int = 50, chunk_ms: int = 40) -> None:
        self._lib, self.sample_rate = _Library.get(chunk_ms)
        self.voice, self.rate, self.pitch = voice, rate, pitch

    def voices(self) -> list[str]:
        import espeakng_loader

        vdir = os.path.join(espeakng_loader.get_data_path(), "lang")
        names = []
        for _dir, _sub, files in os.walk(vdir):
            names += files
        return sorted(set(names))

    def synthesize(self, text: str, voice: str | None, sink: Callable[[SynthChunk], bool]) -> None:
        data = text.encode("utf-8")
        state: dict[str, Any] = {"samples": 0, "stopped": False, "error": None, "end": 0}

        def callback(wav, n, events):  # called by espeak_Synth, on this thread
            try:
                marks, i = [], 0
                while events[i].type != _EVENT_LIST_TERMINATED:
                    e = events[i]
                    start = min(max(e.text_position - 1, 0), len(text))  # positions count characters
                    if e.type == _EVENT_WORD and start >= state["end"]:  # a number's later words: skipped
                        state["end"] = min(start + max(e.length, 1), len(text))
                        marks.append(WordMark(start, state["end"], max(e.sample, state["samples"])))
                    i += 1
                if n <= 0 and not marks:
                    return 0
                samples = np.ctypeslib.as_array(wav, (n,)).astype(np.int16) if n > 0 else np.zeros(0, np.int16)
                state["samples"] += max(n, 0)
                if not sink(SynthChunk(samples, tuple(marks))):
                    state["stopped"] = True
                    return 1
                return 0
            except Exception as exc:  # never raise through C
                state["error"] = exc
                return 1

        cb = _Callback(callback)
        with _Library.lock:
            lib = self._lib
            lib.espeak_SetSynthCallback(cb)
            if lib.espeak_SetVoiceByName((voice or self.voice).encode()) != 0:
                raise ValueError(f"unknown espeak voice {voice or self.voice!r}")
            lib.espeak_SetParameter(_RATE, self.rate, 0)
            lib.espeak_SetParameter(_PITCH, self.pitch, 0)
            lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if state["error"] is not None:
            raise state["error"]

    def speak(self, text: str, voice: str | None = None) -> tuple[np.ndarray, list[WordMark]]:
        """The whole utterance at once: (samples, word marks)."""
        chunks: list[SynthChunk] = []

        def collect(c: SynthChunk) -> bool:
            chunks.append(c)
            return True  # go on

        self.synthesize(text, voice, collect)
        samples = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.int16)
        return samples, [m for c in chunks for m in c.marks]

