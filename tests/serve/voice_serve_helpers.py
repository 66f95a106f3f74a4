"""A voice server for the protocol and browser tests: the session's tiny model engine behind a
second app whose voice engines are the defaults with the demo phrases (PocketSphinx constrained to
them) and the tests' voice; a little arithmetic and a long reply."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Iterator

import numpy as np
from serve_helpers import MODEL_NAME, running_server

from execstate.serve.app import build_app
from execstate.voice.engines import VoiceEngines, default_engines
from execstate.voice.espeak import Espeak
from execstate.voice.resample import resample
from execstate.voice.vocabulary import demo_phrases

USER_VOICE, USER_RATE = "en-us+f2", 150  # what PocketSphinx recognises best (tests/voice/voice_helpers.py)
_engines: VoiceEngines | None = None


def engines() -> VoiceEngines:
    global _engines
    if _engines is None:
        _engines = default_engines(demo_phrases())
    return _engines


@contextlib.contextmanager
def voice_app(served) -> Iterator[tuple[str, object]]:
    """A second app on the served engine (its sessions), with the demo engines; yields its http
    URL and the app."""
    app = build_app(served.engine, MODEL_NAME, sessions=served.sessions, voice_engines=engines)
    with running_server(app) as (url, _server):
        yield url, app


@contextlib.contextmanager
def voice_server(served) -> Iterator[str]:
    """``voice_app``'s URL."""
    with voice_app(served) as (url, _app):
        yield url


def speech(text: str, rate: int = 24000) -> np.ndarray:
    tts = Espeak(voice=USER_VOICE, rate=USER_RATE)
    return resample(tts.speak(text)[0], tts.sample_rate, rate)


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


async def stream_audio(send, samples: np.ndarray, rate: int = 24000, chunk_ms: int = 40) -> None:
    """Send ``samples`` in real time (``send(b64)`` per chunk)."""
    n = rate * chunk_ms // 1000
    t0 = time.monotonic()
    for i in range(0, len(samples), n):
        await send(b64(samples[i:i + n]))
        await asyncio.sleep(max(0.0, t0 + (i + n) / rate - time.monotonic()))
