"""Helpers for the voice tests: real eSpeak speech, a VoiceAgent over the scripted text front
(``tests/agent/agent_fakes.FakeFront``) with the real detector, recognizer and synthesizer, and a
client that streams audio in real time and records every event with its arrival time."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from execstate.agent.backend import Backend
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import RegexPolicy, Rule
from execstate.agent.duplex import DuplexAgent
from execstate.voice.agent import VoiceAgent, VoiceConfig
from execstate.voice.espeak import Espeak
from execstate.voice.numbers import number_words
from execstate.voice.pocketsphinx_asr import PocketSphinx
from execstate.voice.resample import resample
from execstate.voice.silero import SileroVAD
from execstate.voice.vocabulary import demo_phrases

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_fakes import FakeFront  # noqa: E402

# The voice PocketSphinx (demo phrases) recognises best: eSpeak varies its output from call to call
# (state carried between syntheses), and with this voice the question was recognised 15/15 times
# and "391" heard 15/15 times (numbers-only recogniser) on this machine.
USER_VOICE, USER_RATE = "en-us+f2", 150
AGENT_VOICE, AGENT_RATE = "en-us+f2", 150
LONG_REPLY = (" Once upon a time there was a quiet sea, and it was very calm and blue all day long, and the"
              " boats went out every morning and came back every night.")

_asr: PocketSphinx | None = None


def recognizer() -> PocketSphinx:
    global _asr
    if _asr is None:
        _asr = PocketSphinx(demo_phrases())
    return _asr


def speech16k(text: str, voice: str = USER_VOICE, rate: int = USER_RATE) -> np.ndarray:
    tts = Espeak(voice=voice, rate=rate)
    return resample(tts.speak(text)[0], tts.sample_rate, 16000)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16000), dtype=np.int16)


def recognise(samples: np.ndarray, rate: int) -> str:
    s = recognizer().open()
    s.start(0)
    s.feed(np.concatenate([silence(0.3), resample(samples, rate, 16000), silence(0.3)]))
    return s.finish()


_numbers: PocketSphinx | None = None


def says_number(words: str, n: int) -> bool:
    """Whether a numbers-only recognizer's ``words`` begin with ``n`` spoken. Only a prefix: on the
    audio's tail the grammar now and then adds a word after the number (7 of 60 syntheses of
    " 391." in one test: "two", "hundred", "eight"; eSpeak's samples differ from one synthesis to
    the next), which ``words_to_digits`` would merge into another number ("39100")."""
    want = number_words(n).split()
    return words.split()[: len(want)] == want


def heard_number(rec: Recorded, response_id: str, text: str) -> str:
    """Recognise the audio of the word ``text`` in a response (located by the transcript deltas'
    sample offsets) with a numbers-only recognizer; its words (``says_number`` reads them)."""
    global _numbers
    if _numbers is None:
        _numbers = PocketSphinx([number_words(n) for n in range(1000)])
    deltas = [e for e in rec.of("response.output_audio_transcript.delta") if e.response_id == response_id]
    i = next(k for k, e in enumerate(deltas) if text in e.delta)
    audio = rec.audio(response_id)
    end = deltas[i + 1].offset if i + 1 < len(deltas) else len(audio)
    s = _numbers.open()
    s.start(0)
    s.feed(np.concatenate([silence(0.3), resample(audio[deltas[i].offset:end], 24000, 16000), silence(0.3)]))
    return s.finish()


def calc(expression: str) -> str:
    a, _, b = expression.split()
    return str(int(a) * int(b))


def make_agent(reply: str = LONG_REPLY, token_delay: float = 0.01, config: VoiceConfig | None = None,
               tool_delay: float = 0.0) -> tuple[VoiceAgent, FakeFront]:
    front = FakeFront(reply=reply, token_delay=token_delay)

    async def slow_calc(expression: str) -> str:
        await asyncio.sleep(tool_delay)
        return calc(expression)

    agent = DuplexAgent(front, Backend({"calc": slow_calc}),
                        RegexPolicy([Rule(r"(?P<expression>\d+ times \d+)", "calc")]),
                        AgentConfig(max_response_tokens=400))
    va = VoiceAgent(agent, recognizer(), Espeak(voice=AGENT_VOICE, rate=AGENT_RATE), SileroVAD(),
                    config or VoiceConfig(voice=AGENT_VOICE))
    return va, front


@dataclass
class Recorded:
    events: list = field(default_factory=list)  # (arrival s since start, event)

    def of(self, type_: str) -> list:
        return [e for _, e in self.events if e.type == type_]

    def types(self) -> list[str]:
        return [e.type if e.type != "input.turn" else f"input.turn:{e.kind}" for _, e in self.events
                if e.type not in ("response.output_audio.delta", "response.output_audio_transcript.delta",
                                  "conversation.item.input_audio_transcription.delta", "input.end_score")]

    def audio(self, response_id: str) -> np.ndarray:
        parts = [e.samples for e in self.of("response.output_audio.delta") if e.response_id == response_id]
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)


async def converse(va: VoiceAgent, script: list[tuple[float, np.ndarray]], tail_s: float = 3.0,
                   chunk: int = 640) -> Recorded:
    """Start ``va``, play ``script`` ((at seconds, 16 kHz audio) pieces, silence between) in real
    time in chunks of ``chunk`` samples, keep streaming silence ``tail_s`` after the last piece,
    close; every event with its arrival time."""
    rec = Recorded()
    await va.start()
    t0 = time.monotonic()

    async def reader() -> None:
        async for ev in va.events():
            rec.events.append((time.monotonic() - t0, ev))

    task = asyncio.get_running_loop().create_task(reader())
    end = max(at + len(x) / 16000 for at, x in script) + tail_s
    audio = np.zeros(int(end * 16000), dtype=np.int16)
    for at, x in script:
        i = int(at * 16000)
        audio[i:i + len(x)] = x
    for i in range(0, len(audio), chunk):
        await va.append(audio[i:i + chunk])
        await asyncio.sleep(max(0.0, t0 + (i + chunk) / 16000 - time.monotonic()))
    await va.close()
    await task
    return rec
