"""Identity and failure of LM sessions: a weights update makes the next step fail the
session clearly (``stale_state``) unless a re-prefill is asked; a failed step moves the session to
FAILED, is never retried in place, and only reset (to the last checkpoint) or close are accepted."""

from __future__ import annotations

import pytest
from session_helpers import GREEDY, check_accounting, check_released, generate, make_llm, tokens

from execstate.session.runtime.events import SessionEventError

A, B, C = tokens(30, 21), tokens(31, 6), tokens(32, 5)


def code(fn) -> str:
    with pytest.raises(SessionEventError) as ei:
        fn()
    return ei.value.code


def test_weights_update_fails_the_next_step_unless_reprefill(moe_dir, moe_dir_other_weights):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    r1 = s.step(A)
    key_before = s.state_key()
    cp = s.checkpoint()
    llm.update_weights(moe_dir_other_weights)
    with pytest.raises(SessionEventError) as ei:
        s.step(B)
    assert ei.value.code == "stale_state" and "weights version now" in ei.value.message
    assert s.status == "failed"
    assert code(lambda: s.step(B)) == "failed" and code(s.checkpoint) == "failed"
    s.reset()  # back to the checkpoint: still computed under the old weights
    assert s.state_key() != key_before  # a fresh epoch after the reset
    assert code(lambda: s.step(B)) == "stale_state"
    s.reset()
    r2 = s.step(B, reprefill=True)  # drop the KV and the route rows, recompute the whole context
    history = A + r1.token_ids + B
    new = make_llm(moe_dir_other_weights)
    ref = generate(new, history)
    assert r2.token_ids == ref.token_ids
    assert (r2.num_computed_tokens, r2.num_cached_tokens) == (len(history), 0)
    assert s.routed_experts.tobytes() == ref.routed_experts.tobytes()  # every row from the new weights
    r3 = s.step(C)  # and on from there without re-prefill
    assert r3.token_ids == generate(new, history + r2.token_ids + C).token_ids and r3.num_computed_tokens == 6
    check_accounting(llm)
    s.close()
    cp.release()
    check_released(llm)


def test_a_step_queued_across_a_drained_weights_update_fails_its_session(moe_dir, moe_dir_other_weights):
    llm = make_llm(moe_dir)
    eng = llm.engine
    s = llm.open_session(sampling_params=GREEDY)
    s.step(A)
    eng.add_request(tokens(33, 8), GREEDY, "batch")
    eng.step()
    eng.begin_weight_update(str(moe_dir_other_weights), policy="drain")  # "batch" finishes on the old weights
    with pytest.raises(SessionEventError) as ei:
        s.step(B)  # queued holding old-weights KV, held back by the drain, then failed at the switch
    assert ei.value.code == "failed" and "stale" in ei.value.message
    assert s.status == "failed" and eng.weight_update is None
    s.reset()  # to the origin: an empty session, fine under the new weights
    assert s.token_ids == [] and s.step(A).token_ids == generate(make_llm(moe_dir_other_weights), A).token_ids
    s.close()
    check_released(llm)


class FailOnce:
    def __init__(self, real) -> None:
        self.real, self.calls = real, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("injected step fault")
        return self.real(*args, **kwargs)


def test_a_failed_step_fails_the_session_and_only_reset_or_close_work(moe_dir, monkeypatch):
    llm, cold = make_llm(moe_dir), make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    r1 = s.step(A)
    s.checkpoint()
    other = llm.engine.add_request(tokens(34, 10), GREEDY, "other")  # in the failing step too
    monkeypatch.setattr(llm.engine.runner, "execute", FailOnce(llm.engine.runner.execute))
    with pytest.raises(SessionEventError) as ei:
        s.step(B)
    assert ei.value.code == "failed" and "injected step fault" in ei.value.message
    assert s.status == "failed" and s.step_index == 1
    assert other not in llm.engine.requests  # the batch request of that step failed too, the engine lives
    check_accounting(llm)  # the failed step's blocks went back and were released; the checkpoint still pins
    for call in (lambda: s.step(C), s.checkpoint, lambda: s.submit_event(50, "input", {"token_ids": [1]}),
                 lambda: s.fork(), lambda: s.rollback("cp-1")):
        assert code(call) == "failed"
    s.reset()
    assert s.status == "open" and s.step_index == 1 and s.token_ids == A + r1.token_ids
    r2 = s.step(B)  # what it would have produced without the fault
    assert r2.token_ids == generate(cold, A + r1.token_ids + B).token_ids and r2.num_computed_tokens == 7
    s.close()
    check_released(llm)


def test_a_failed_session_without_checkpoint_resets_to_empty_and_close_releases(moe_dir, monkeypatch):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    s.step(A)
    monkeypatch.setattr(llm.engine.runner, "execute", FailOnce(llm.engine.runner.execute))
    assert code(lambda: s.step(B)) == "failed"
    s.reset()
    assert (s.token_ids, s.step_index, s.status) == ([], 0, "open")
    s.close()
    check_released(llm)
