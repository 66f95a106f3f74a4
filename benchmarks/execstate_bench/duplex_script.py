"""Scripted timed conversations for ``execstate bench duplex`` (pure Python, seeded).

A conversation is a list of user turns; each turn is one of:

- ``plain``: a sentence in word chunks (80-200 ms apart). 70 % of the turns (of every kind but
  the backchannel's) have a mid-utterance pause (0.3-0.7 s, after a chunk that does not end a
  sentence): the agent must not take the turn there (Full-Duplex-Bench pause handling: TOR).
- ``delegated``: a question only the back end can answer (a product by the ``calc`` tool, a code
  by the ``lookup`` tool; each with a back-end latency of 0.4-1.2 s): the answer is known, so the
  share of delegated answers spoken correctly is measurable.
- ``barge_in``: a request for a long answer; at a random point of the reply (0.2-1.0 s after its
  first word) the user interrupts with a new request, word by word.
- ``backchannel``: a request; at a random point of the reply the user says a backchannel (1-2
  words, Full-Duplex-Bench's user-backchannel case): the agent must keep its turn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SUBJECTS = ["the sea", "mountains", "coffee", "trains", "the moon", "gardens", "music", "rain"]
NAMES = ["zebra", "falcon", "cedar", "orbit", "harbor", "quartz", "willow", "ember"]
BACKCHANNELS = ["uh huh", "yeah", "mm-hm", "right", "okay", "I see", "oh wow", "sure"]
PLAIN = ["I was thinking about {s} today and I wonder what you think.",
         "Could you tell me something nice about {s}?",
         "My friend keeps talking about {s} all the time."]


@dataclass(frozen=True)
class Chunk:
    gap_s: float  # silence before this chunk
    text: str
    pause: bool = False  # this gap is a mid-utterance pause (the agent must not take the turn)


@dataclass(frozen=True)
class Turn:
    kind: str  # plain | delegated | barge_in | backchannel
    chunks: tuple[Chunk, ...]
    answer: str | None = None  # delegated: the text a correct answer contains
    tool: str | None = None
    interrupt_after_s: float | None = None  # barge_in / backchannel: after the reply's first word
    interruption: tuple[Chunk, ...] = ()  # barge_in: the new request; backchannel: the backchannel


@dataclass(frozen=True)
class Conversation:
    turns: tuple[Turn, ...]
    codes: dict[str, str] = field(default_factory=dict)  # the lookup tool's table


def _chunks(rng: random.Random, text: str, pause: bool) -> tuple[Chunk, ...]:
    words = text.split()
    out, i, first = [], 0, True
    pause_at = rng.randrange(2, len(words) - 1) if pause and len(words) > 4 else None
    while i < len(words):
        n = rng.choice((1, 1, 2, 3))
        if pause_at is not None and i < pause_at < i + n:
            n = pause_at - i
        is_pause = pause_at is not None and i == pause_at
        gap = 0.0 if first else (rng.uniform(0.3, 0.7) if is_pause else rng.uniform(0.08, 0.2))
        out.append(Chunk(gap, " ".join(words[i:i + n]), is_pause))
        i, first = i + n, False
    return tuple(out)


def make_conversation(seed: int, n_turns: int = 8) -> Conversation:
    rng = random.Random(seed)
    codes = {name: f"{rng.choice('ABCDEFGHJK')}{rng.choice('LMNPQRSTUV')}-{rng.randrange(1000, 9999)}"
             for name in NAMES}
    kinds = ["plain", "delegated", "barge_in", "backchannel"] * ((n_turns + 3) // 4)
    rng.shuffle(kinds)
    turns = []
    for kind in kinds[:n_turns]:
        s = rng.choice(SUBJECTS)
        if kind == "plain":
            turns.append(Turn(kind, _chunks(rng, rng.choice(PLAIN).format(s=s), pause=rng.random() < 0.7)))
        elif kind == "delegated":
            if rng.random() < 0.5:
                a, b = rng.randrange(12, 99), rng.randrange(12, 99)
                turns.append(Turn(kind, _chunks(rng, f"Quick question, what is {a} times {b}?", rng.random() < 0.7),
                                  answer=str(a * b), tool="calc"))
            else:
                name = rng.choice(NAMES)
                turns.append(Turn(kind, _chunks(rng, f"What is the access code of {name}?", rng.random() < 0.7),
                                  answer=codes[name], tool="lookup"))
        elif kind == "barge_in":
            new = f"wait stop, tell me about {rng.choice(SUBJECTS)} instead."
            turns.append(Turn(kind, _chunks(rng, f"Tell me a long story about {s}.", rng.random() < 0.7),
                              interrupt_after_s=rng.uniform(0.2, 1.0), interruption=_chunks(rng, new, False)))
        else:
            bc = rng.choice(BACKCHANNELS)
            turns.append(Turn(kind, _chunks(rng, f"Describe {s} for me.", False),
                              interrupt_after_s=rng.uniform(0.2, 0.8), interruption=(Chunk(0.0, bc),)))
    return Conversation(tuple(turns), codes)
