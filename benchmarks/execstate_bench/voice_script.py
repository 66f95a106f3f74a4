"""Scripted spoken conversations for ``execstate bench voice``: ``duplex_script``'s conversations
(plain turns with mid-utterance pauses, delegated questions, barge-ins, backchannels) spoken by
eSpeak NG in the user's voice at 16 kHz.

Each chunk of a turn is synthesised on its own and separated by its gap of silence (the pauses of
0.3-0.7 s are real silence in the audio), so the script knows where every word is:
``Utterance.words`` are (start sample, end sample, word as written) from the synthesizer's word
marks. Only calculator questions are delegated here ("what is A times B": the server's calculator
answers; access codes would need the script's table on the server).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from execstate.voice.espeak import Espeak
from execstate.voice.resample import resample
from execstate_bench.duplex_script import Chunk, Conversation, Turn, _chunks, make_conversation

RATE = 16000


@dataclass(frozen=True)
class Utterance:
    text: str
    samples: np.ndarray  # int16 at 16 kHz
    words: tuple[tuple[int, int, str], ...]  # (start, end) samples of each word, and the word

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE


@dataclass(frozen=True)
class SpokenTurn:
    kind: str  # plain | delegated | barge_in | backchannel
    parts: tuple[tuple[float, Utterance, bool], ...]  # (gap before, utterance, the gap is a pause)
    answer: str | None
    interrupt_after_s: float | None
    interruption: tuple[tuple[float, Utterance, bool], ...]


def speak(tts: Espeak, text: str) -> Utterance:
    audio, marks = tts.speak(text)
    x = resample(audio, tts.sample_rate, RATE)
    scale = RATE / tts.sample_rate
    starts = [int(m.sample * scale) for m in marks]
    words = tuple((s, starts[i + 1] if i + 1 < len(starts) else len(x), _as_written(text, m.start))
                  for i, (s, m) in enumerate(zip(starts, marks, strict=True)))
    return Utterance(text, x, words)


def _as_written(text: str, start: int) -> str:
    """The word at ``start`` as written, up to the next space (with its punctuation)."""
    end = text.find(" ", start)
    return text[start:end if end >= 0 else len(text)]


def _spoken(tts: Espeak, chunks: tuple[Chunk, ...]) -> tuple[tuple[float, Utterance, bool], ...]:
    return tuple((c.gap_s, speak(tts, c.text), c.pause) for c in chunks)


def calculator_only(conv: Conversation, seed: int) -> Conversation:
    """Lookup questions replaced by products (the server's calculator answers them)."""
    rng = random.Random(seed)
    turns = []
    for t in conv.turns:
        if t.kind == "delegated" and t.tool != "calc":
            a, b = rng.randrange(12, 99), rng.randrange(12, 99)
            t = Turn("delegated", _chunks(rng, f"Quick question, what is {a} times {b}?", rng.random() < 0.7),
                     answer=str(a * b), tool="calc")
        turns.append(t)
    return Conversation(tuple(turns), conv.codes)


def spoken_conversation(seed: int, n_turns: int, voice: str, rate: int) -> list[SpokenTurn]:
    tts = Espeak(voice=voice, rate=rate)
    conv = calculator_only(make_conversation(seed, n_turns), seed)
    return [SpokenTurn(t.kind, _spoken(tts, t.chunks), t.answer, t.interrupt_after_s, _spoken(tts, t.interruption))
            for t in conv.turns]
