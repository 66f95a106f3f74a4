"""Turn policy on generated timed streams, against a direct oracle of the rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.agent.turn_policy import Decision, TurnConfig, TurnPolicy

CFG = TurnConfig(end_of_turn_silence_s=0.8, backchannel_max_words=2, resume_after_s=0.6)
TICK = 0.05


def run(chunks: list[tuple[float, int]], speaking: bool, cfg: TurnConfig = CFG, until: float = 5.0):
    """Feed ``(gap, n_words)`` chunks with ticks every TICK s in between; [(t, decision)]."""
    p, out, t, tick = TurnPolicy(cfg), [], 0.0, 0.0
    for gap, n in chunks:
        t += gap
        while tick + TICK <= t:
            tick += TICK
            d = p.on_tick(tick)
            if d is not Decision.NONE:
                out.append((tick, d))
        d = p.on_input(n, t, speaking)
        if d is not Decision.NONE:
            out.append((t, d))
    while tick < t + until:
        tick += TICK
        d = p.on_tick(tick)
        if d is not Decision.NONE:
            out.append((tick, d))
    return out


gaps = st.floats(min_value=0.01, max_value=0.75)  # all shorter than the end-of-turn silence


@given(st.lists(st.tuples(gaps, st.integers(1, 4)), min_size=1, max_size=12))
@settings(max_examples=150, deadline=None)
def test_pauses_shorter_than_the_silence_never_take_the_turn(chunks):
    out = run(chunks, speaking=False)
    t_last = sum(g for g, _ in chunks)
    assert [d for _, d in out] == [Decision.END_OF_TURN]  # one, after the last chunk only
    t_end = out[0][0]
    assert t_last + CFG.end_of_turn_silence_s <= t_end + 1e-6 <= t_last + CFG.end_of_turn_silence_s + TICK + 2e-6


@given(st.lists(st.tuples(st.floats(0.01, 0.5), st.integers(1, 3)), min_size=1, max_size=6))
@settings(max_examples=150, deadline=None)
def test_bursts_while_speaking_barge_in_exactly_when_above_the_backchannel_length(chunks):
    out = run(chunks, speaking=True)
    total, cross = 0, None
    for i, (_, n) in enumerate(chunks):
        total += n
        if total > CFG.backchannel_max_words:
            cross = i
            break
    ds = [d for _, d in out]
    if cross is None:  # a backchannel: holds, then resumes once, never barges in
        assert Decision.BARGE_IN not in ds and ds.count(Decision.RESUME) == 1
        assert ds[-1] is Decision.RESUME
        assert set(ds[:-1]) == {Decision.HOLD}
        t_res = out[-1][0]
        t_last = sum(g for g, _ in chunks)
        assert t_res - t_last < CFG.resume_after_s + TICK + 1e-6 and t_res - t_last < 2.0
    else:
        assert ds.count(Decision.BARGE_IN) == 1
        t_cross = sum(g for g, _ in chunks[: cross + 1])
        assert (t_cross, Decision.BARGE_IN) in out
        assert ds[-1] is Decision.END_OF_TURN and Decision.RESUME not in ds


def test_no_pause_option_reports_backchannels():
    p = TurnPolicy(TurnConfig(pause_on_speech=False))
    assert p.on_input(2, 0.0, True) is Decision.BACKCHANNEL
    assert p.on_input(1, 0.1, True) is Decision.BARGE_IN
    assert p.user_turn_open and not p.burst_open


def test_a_final_looking_chunk_ends_the_turn_after_the_shorter_silence():
    p = TurnPolicy(CFG)
    p.on_input(3, 0.0, False, final=True)
    assert p.next_deadline() == pytest.approx(CFG.final_silence_s)
    fs = CFG.final_silence_s
    assert p.on_tick(fs - 0.01) is Decision.NONE and p.on_tick(fs) is Decision.END_OF_TURN
    p.on_input(2, 1.0, False, final=True)
    p.on_input(2, 1.1, False, final=False)  # it went on: the long silence again
    assert p.on_tick(1.5) is Decision.NONE and p.on_tick(1.95) is Decision.END_OF_TURN


def test_deadlines_and_errors():
    p = TurnPolicy(CFG)
    assert p.next_deadline() is None
    p.on_input(1, 1.0, False)
    assert p.next_deadline() == pytest.approx(1.8)
    with pytest.raises(ValueError, match="time went back"):
        p.on_tick(0.5)
    with pytest.raises(ValueError, match="backchannel_max_words"):
        TurnConfig(backchannel_max_words=-1)
    with pytest.raises(ValueError, match="must be > 0"):
        TurnConfig(end_of_turn_silence_s=0)
