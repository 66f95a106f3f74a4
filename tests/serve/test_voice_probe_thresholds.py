"""``semantic_vad``'s settings when the agents score the end of the turn with the end-of-turn probe
(``serve/realtime/voice/convert.py``): each eagerness takes the probe's threshold (chosen on its
training data) and the same silences, with no graded wait; without the probe, ``EAGERNESS``."""

from __future__ import annotations

import pytest

from execstate.agent import end_probe
from execstate.serve.realtime.voice.convert import EAGERNESS, eagerness_table, session_json, voice_config
from execstate.serve.realtime.voice.messages import Audio, AudioIn, TurnDetection, VoiceSession
from execstate.session.runtime.events import SessionEventError
from execstate.voice.agent import VoiceConfig

PROBE = end_probe.shipped()


def semantic(eagerness: str | None, **kw) -> VoiceSession:
    td = TurnDetection(type="semantic_vad", eagerness=eagerness, **kw)
    return VoiceSession(audio=Audio(input=AudioIn(turn_detection=td)))


@pytest.mark.parametrize(("eagerness", "threshold", "short", "long"),
                         [("high", 0.2, 0.15, 0.7), ("medium", 0.5, 0.2, 1.0), (None, 0.5, 0.2, 1.0),
                          ("low", 0.9, 0.3, 1.5)])
def test_each_eagerness_takes_the_probes_threshold(eagerness, threshold, short, long):
    cfg = voice_config(semantic(eagerness), VoiceConfig(), set(), PROBE)
    t = cfg.turns
    assert (t.end_threshold, t.semantic_silence_s, t.end_of_turn_silence_s, t.graded_wait) == (
        threshold, short, long, False)
    td = session_json("s", "m", "", cfg, PROBE)["audio"]["input"]["turn_detection"]
    assert td["eagerness"] == (eagerness or "medium") and td["end_of_turn_threshold"] == threshold
    plain = voice_config(semantic(eagerness), VoiceConfig(), set()).turns
    assert (plain.end_threshold, plain.graded_wait) == (EAGERNESS[eagerness or "auto"][0], True)


def test_an_explicit_threshold_still_overrides_and_the_table_keeps_the_silences():
    t = voice_config(semantic("high", end_of_turn_threshold=0.7), VoiceConfig(), set(), PROBE).turns
    assert (t.end_threshold, t.graded_wait) == (0.7, False)
    assert {k: v[1:] for k, v in eagerness_table(PROBE).items()} == {k: v[1:] for k, v in EAGERNESS.items()}
    assert eagerness_table(None) is EAGERNESS
    with pytest.raises(SessionEventError, match="eagerness"):
        voice_config(semantic("eager"), VoiceConfig(), set(), PROBE)
