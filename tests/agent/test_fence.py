"""The cancel fence: random interleavings of starts, deltas (tagged with the epoch their step
started in, possibly an old one), finishes and interrupts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.agent.agent_events import OutputDelta, ResponseCreated, ResponseDone
from execstate.agent.fence import ResponseFence

ops = st.lists(st.tuples(st.sampled_from(["start", "delta", "delta", "delta", "old_delta", "finish", "interrupt",
                                          "step_start"]), st.integers(0, 3)), max_size=80)


def check_log(log):
    ended: dict[str, int] = {}
    created: dict[str, int] = {}
    epoch_now = 0
    for i, ev in enumerate(log):
        if isinstance(ev, ResponseCreated):
            assert ev.response_id not in created
            created[ev.response_id] = ev.epoch
            assert ev.epoch >= epoch_now
            epoch_now = ev.epoch
        elif isinstance(ev, OutputDelta):
            assert ev.response_id in created and ev.response_id not in ended, "delta after its terminal"
            assert ev.epoch == created[ev.response_id] and ev.epoch >= epoch_now
        elif isinstance(ev, ResponseDone):
            assert ev.response_id in created and ev.response_id not in ended, "second terminal"
            ended[ev.response_id] = i
    return created, ended


@given(ops)
@settings(max_examples=300, deadline=None)
def test_no_old_epoch_output_after_the_terminal_and_one_terminal_each(script):
    log = []
    f = ResponseFence(log.append)
    step_epoch, step_resp, t = 0, None, 0.0
    for op, k in script:
        t += 0.01
        if op == "start" and not f.active:
            f.start(t, "turn")
        elif op == "step_start" and f.current is not None:
            step_epoch, step_resp = f.epoch, f.current.response_id
        elif op == "delta" and step_resp is not None:
            emitted = f.delta(step_resp, step_epoch, "x" * (k + 1), (k,), t)
            assert emitted == (f.current is not None and f.current.response_id == step_resp and f.epoch == step_epoch)
        elif op == "old_delta" and step_resp is not None:
            assert not f.delta(step_resp, step_epoch - 1 - k, "y", (1,), t)
        elif op == "finish" and f.current is not None:
            rid = f.current.response_id
            assert f.finish(rid, "completed" if k else "failed", t)
            assert not f.finish(rid, "completed", t)
        elif op == "interrupt":
            before = f.epoch
            r = f.interrupt(t, "barge_in")
            assert f.epoch == before + 1 and f.current is None
            if r is not None:
                assert isinstance(log[-1], ResponseDone) and log[-1].status == "cancelled"
    if f.current is not None:
        f.interrupt(t, "closed")
    created, ended = check_log(log)
    assert set(created) == set(ended)  # every response ended, exactly once


def test_finish_refuses_cancelled_status_and_start_refuses_overlap():
    f = ResponseFence(lambda e: None)
    r = f.start(0.0, "turn")
    with pytest.raises(ValueError):
        f.finish(r.response_id, "cancelled", 0.1)
    with pytest.raises(RuntimeError):
        f.start(0.1, "turn")


def test_tokens_within_counts_whole_deltas():
    f = ResponseFence(lambda e: None)
    r = f.start(0.0, "turn")
    for text, toks in ((" Hello", (1, 2)), (" wor", (3,)), ("ld", (4,))):
        f.delta(r.response_id, 0, text, toks, 0.1)
    assert [r.tokens_within(n) for n in (0, 5, 6, 9, 10, 11, 12, 100)] == [0, 0, 2, 2, 3, 3, 4, 4]
