"""``execstate_bench/voice_audio_store.py``: the bench's spoken conversations written once and read
back sample for sample, and refused for another workload."""

from __future__ import annotations

import numpy as np
import pytest

from execstate_bench import voice_audio_store
from execstate_bench.voice_script import spoken_conversation


def test_the_conversations_come_back_sample_for_sample(tmp_path):
    scripts = [spoken_conversation(0, 4, "en-us+f2", 150), spoken_conversation(1, 3, "en-us", 150)]
    workload = {"seed": 0, "turns": 4, "voices": ["en-us+f2", "en-us"], "rate_wpm": 150}
    path = tmp_path / "user.npz"
    voice_audio_store.save(path, scripts, workload)
    back = voice_audio_store.load(path, workload)
    assert voice_audio_store.workload_of(path) == workload
    assert [len(c) for c in back] == [4, 3]
    n = 0
    for conv, conv_back in zip(scripts, back, strict=True):
        for t, tb in zip(conv, conv_back, strict=True):
            assert (tb.kind, tb.answer, tb.interrupt_after_s) == (t.kind, t.answer, t.interrupt_after_s)
            for ps, ps_back in ((t.parts, tb.parts), (t.interruption, tb.interruption)):
                assert len(ps) == len(ps_back)
                for (gap, u, pause), (gap_b, ub, pause_b) in zip(ps, ps_back, strict=True):
                    assert (gap_b, pause_b, ub.text, ub.words) == (gap, pause, u.text, u.words)
                    assert ub.samples.dtype == np.int16 and np.array_equal(ub.samples, u.samples)
                    n += 1
    assert n >= 7  # every turn has at least one utterance


def test_a_file_made_for_another_workload_is_refused(tmp_path):
    path = tmp_path / "user.npz"
    voice_audio_store.save(path, [spoken_conversation(0, 2, "en-us", 150)],
                           {"seed": 0, "turns": 2, "voices": ["en-us"], "rate_wpm": 150})
    with pytest.raises(ValueError, match="not of"):
        voice_audio_store.load(path, {"seed": 0, "turns": 3, "voices": ["en-us"], "rate_wpm": 150})
