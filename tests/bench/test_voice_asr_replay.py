"""``execstate_bench/voice_asr_replay.py`` without models: stored utterances through a loudness
detector and a recognizer that hears each tone's level as known words; the words the agent would
get, their errors, and the audio the last transcription re-heard."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from execstate_bench.voice_asr_replay import replay, summary
from execstate_bench.voice_script import SpokenTurn, Utterance

RATE = 16000
HEARS = {1000: "hello world", 2000: "there.", 3000: "uh huh"}  # a tone's amplitude -> what is heard


def _tone(amp: int, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amp * np.sin(2 * np.pi * 220 * t)).astype(np.int16)


def _u(text: str, amp: int, seconds: float = 1.0) -> Utterance:
    return Utterance(text, _tone(amp, seconds), ())


class _Loud:
    sample_rate, frame_samples = RATE, 512

    def probability(self, frame: np.ndarray) -> float:
        return 1.0 if np.abs(frame.astype(np.int32)).max() > 100 else 0.0

    def reset(self) -> None:
        pass


class _Stream:
    def __init__(self, rec: _Levels) -> None:
        self.rec = rec

    def start(self, at_sample: int) -> None:
        self.fed: list[np.ndarray] = []

    def feed(self, samples: np.ndarray) -> str | None:
        self.fed.append(samples)
        return None

    def finish(self) -> str:
        x = np.concatenate(self.fed)
        self.rec.submit(x).result()  # a worker's transcription of the whole segment
        level = min(HEARS, key=lambda a: abs(a - int(np.abs(x.astype(np.int32)).max())))
        return HEARS[level]

    def close(self) -> None:
        pass


class _Levels:
    sample_rate = RATE

    def __init__(self) -> None:
        self.submitted: list[int] = []

    def open(self) -> _Stream:
        return _Stream(self)

    def submit(self, samples: np.ndarray) -> Future[str]:
        self.submitted.append(len(samples))
        f: Future[str] = Future()
        f.set_result("")
        return f


def test_each_utterance_heard_as_the_agent_would_get_it() -> None:
    conv = [
        SpokenTurn("plain", ((0.0, _u("hello world", 1000), False),), None, None, ()),
        SpokenTurn("backchannel", ((0.0, _u("Hello world.", 1000), False),), None, 0.5,
                   ((0.0, _u("uh huh", 3000, 0.4), False),)),
        # a pause longer than the VAD's silence: two segments, their words joined, the mark dropped
        SpokenTurn("barge_in", ((0.0, _u("hello world", 1000), False), (0.5, _u("there", 2000, 0.5), True)), None, 0.5,
                   ((0.0, _u("hello there", 1000), False),)),  # misheard: "hello world"
    ]
    rec = _Levels()
    rows = replay([conv], rec, _Loud, speed=0)
    got = [(r["kind"], r["said"], r["heard"], r["errors"], r["words"]) for r in rows]
    assert got == [("turn", "hello world", "hello world", 0, 2),
                   ("turn", "Hello world.", "hello world", 0, 2),
                   ("backchannel", "uh huh", "uh huh", 0, 2),
                   ("turn", "hello world there", "hello world there", 0, 3),
                   ("barge_in", "hello there", "hello world", 1, 2)]
    assert all(r["final_s"] is not None and 0 <= r["final_s"] < 1.0 for r in rows)
    # the last transcription after the end of the speech is the last segment's, whole
    assert rows[-1]["reheard_s"] == round(rec.submitted[-1] / RATE, 2) > 1.0
    assert rows[3]["reheard_s"] == round(rec.submitted[4] / RATE, 2) < rows[-1]["reheard_s"]  # "there": its own
    s = summary(rows)
    assert (s["utterances"], s["words"], s["wer"]) == (4, 9, round(1 / 9, 3))  # the backchannel not counted
    assert s["reheard_s"]["max"] == rows[-1]["reheard_s"]
