"""The engines a voice server hands each new ``VoiceAgent``, and the defaults.

``VoiceEngines``: one ``recognizer`` (shared: each agent opens its own stream, which it closes
when the agent closes; the recognizer may keep the stream's model for the next one), one
``synthesizer`` (shared: eSpeak serialises itself), ``detector()`` (a new, stateful speech
detector per agent; the default's ONNX session is shared), the ``voices`` a client may pick and
the ``voice`` used by default.
``default_engines(phrases, asr=...)`` builds eSpeak NG, Silero VAD and PocketSphinx (the general
English model, or a constrained one built from ``phrases``) or Moonshine (``asr="moonshine"``); the
imports happen here, so a server without the audio packages still starts (the voice endpoint
then answers with an error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from execstate.voice.interfaces import Recognizer, SpeechDetector, Synthesizer

VOICES = ("en-us", "en-us+f2", "en-us+f5", "en-us+m3", "en", "en+f3")
DEFAULT_VOICE = "en-us+f2"
DEFAULT_RATE = 150  # words per minute: the rate PocketSphinx recognises eSpeak best at (tests/voice)


@dataclass(frozen=True)
class VoiceEngines:
    recognizer: Recognizer
    synthesizer: Synthesizer
    detector: Callable[[], SpeechDetector]
    voices: frozenset[str] = field(default_factory=lambda: frozenset(VOICES))
    voice: str = DEFAULT_VOICE


def default_engines(phrases: Sequence[str] | None = None, voice: str = DEFAULT_VOICE,
                    rate: int = DEFAULT_RATE, asr: str = "pocketsphinx") -> VoiceEngines:
    """``asr``: ``pocketsphinx`` (``phrases``: its language model) or ``moonshine``."""
    from execstate.voice.espeak import Espeak
    from execstate.voice.silero import SileroModel, SileroVAD

    recognizer: Recognizer
    if asr == "moonshine":
        from execstate.voice.moonshine_asr import Moonshine

        recognizer = Moonshine()
    elif asr == "pocketsphinx":
        from execstate.voice.pocketsphinx_asr import PocketSphinx

        recognizer = PocketSphinx(phrases)
    else:
        raise ValueError(f"asr must be 'pocketsphinx' or 'moonshine', got {asr!r}")
    vad = SileroModel()  # one session for every agent's detector; fails now (a clear error) without silero-vad
    return VoiceEngines(recognizer, Espeak(voice=voice, rate=rate), lambda: SileroVAD(vad),
                        frozenset({*VOICES, voice}), voice)
