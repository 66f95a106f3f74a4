"""Example phrases for a constrained recognizer (``PocketSphinx(phrases=...)``): the demo domain.

``demo_phrases()`` is deterministic: spoken arithmetic questions (random ones over 1-99, and the
demo's ``EXAMPLES``, weighted as phrases a user expects), spoken answers ("the answer is three
hundred ninety one"), lookups ("what is the code of
zebra") and the conversational glue the demo and the benchmark use (requests for stories,
interruptions, backchannels). A user with another domain passes their own phrases.
"""

from __future__ import annotations

import random

from execstate.voice.numbers import ONES, TENS, number_words

SUBJECTS = ["the sea", "mountains", "coffee", "trains", "the moon", "gardens", "music", "rain"]
NAMES = ["zebra", "falcon", "cedar", "orbit", "harbor", "quartz", "willow", "ember"]
BACKCHANNELS = ["uh huh", "yeah", "right", "okay", "i see", "oh wow", "sure", "mm hmm"]
GLUE = ["let me check", "one moment", "hello", "thank you", "good morning", "hi there",
        "i was thinking about {s} today and i wonder what you think",
        "could you tell me something nice about {s}", "my friend keeps talking about {s} all the time",
        "tell me a long story about {s}", "please tell me a long story about {s}",
        "wait stop tell me about {s} instead", "wait stop", "what is the code of {n}",
        "please tell me the access code of {n}", "the answer is {n}"]


# The demo's example questions, as a user lists the phrases they expect (the tests ask the first).
EXAMPLES = ["what is seventeen times twenty three", "what is twelve times eleven", "what is forty two plus seven"]


def _number(rng: random.Random) -> str:
    """A number word of 1-99, every first word (one .. nineteen, twenty .. ninety) equally likely."""
    w = rng.choice(ONES[1:] + TENS[2:])
    return w if w in ONES or rng.random() < 0.3 else f"{w} {rng.choice(ONES[1:10])}"


def demo_phrases(seed: int = 0, questions: int = 2000) -> list[str]:
    rng = random.Random(seed)
    out = [f"the answer is {number_words(n)}" for n in range(1000)]
    out += [f"what is {_number(rng)} {rng.choice(['times', 'plus', 'minus'])} {_number(rng)}" for _ in range(questions)]
    out += EXAMPLES * 20
    out += [g.format(s=s, n=n) for g in GLUE for s in SUBJECTS for n in NAMES[:1]]
    out += [f"what is the code of {n}" for n in NAMES] + [f"the answer is {n}" for n in NAMES]
    out += BACKCHANNELS
    return out
