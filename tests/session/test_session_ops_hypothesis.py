"""Random sequences of session operations (open, step, submit_event, checkpoint, rollback, fork,
release, reset, close) on one engine with a small KV pool: after every operation every block
reference belongs to a request or to a session/checkpoint hold (the failed-step check), each
open session's KV, routes and tokens agree, and greedy steps equal a reference generate over the
same context. After closing everything nothing is held."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from session_helpers import GREEDY, check_accounting, check_released, generate, make_llm

from execstate.session.runtime.events import SessionEventError

CODES = {"invalid", "stale", "backpressure", "busy", "failed", "not_found", "closed", "capacity"}

step_op = st.tuples(st.just("step"), st.integers(0, 7), st.lists(st.integers(3, 500), max_size=20),
                   st.integers(1, 6))
op = st.one_of(
    st.tuples(st.just("open")),
    st.tuples(st.just("open")),
    step_op,
    step_op,
    step_op,
    step_op,
    st.tuples(st.just("event"), st.integers(0, 7), st.integers(-1, 2), st.lists(st.integers(3, 500), max_size=4)),
    st.tuples(st.just("checkpoint"), st.integers(0, 7)),
    st.tuples(st.just("rollback"), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("fork"), st.integers(0, 7), st.integers(-1, 7)),
    st.tuples(st.just("release"), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("reset"), st.integers(0, 7)),
    st.tuples(st.just("close"), st.integers(0, 7)),
    st.tuples(st.just("failing_step"), st.integers(0, 7), st.lists(st.integers(3, 500), max_size=5)),
)


@pytest.fixture(scope="module")
def engines(moe_dir):
    return make_llm(moe_dir, num_kv_blocks=10, max_model_len=80, max_sessions=6), make_llm(moe_dir)


def _raise(*args, **kwargs):
    raise RuntimeError("injected step fault")


def pick(items, i):
    return items[i % len(items)] if items else None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=4, max_size=30))
def test_random_session_operations_keep_the_block_accounting(engines, ops):
    llm, ref = engines
    sessions = []
    try:
        for o in [("open",), ("step", 0, list(range(40, 57)), 2), *ops]:
            s = pick(sessions, o[1]) if len(o) > 1 else None
            try:
                if o[0] == "open":
                    sessions.append(llm.open_session(sampling_params=GREEDY))
                elif s is None:
                    continue
                elif o[0] == "step":
                    r = s.step(list(o[2]) or None, max_tokens=o[3])
                    context = s.token_ids[: len(s.token_ids) - len(r.token_ids)]  # with pending events applied
                    if r.finish_reason == "length" and len(r.token_ids) == o[3]:  # not cut by max_model_len
                        assert r.token_ids == generate(ref, context, max_tokens=o[3]).token_ids
                elif o[0] == "event":
                    s.submit_event(max(0, (s.info().last_event_id or 0) + o[2]), "input", {"token_ids": list(o[3])})
                elif o[0] == "checkpoint":
                    s.checkpoint()
                elif o[0] == "rollback":
                    s.rollback(pick(s.checkpoints, o[2]) or "cp-0")
                elif o[0] == "fork":
                    cp = pick(s.checkpoints, o[2]) if o[2] >= 0 else None
                    sessions.append(s.fork(cp))
                elif o[0] == "release":
                    cp = pick(s.checkpoints, o[2])
                    if cp is not None:
                        cp.release() if o[2] % 2 else s.release_checkpoint(cp)
                elif o[0] == "reset":
                    s.reset()
                elif o[0] == "close":
                    s.close()
                elif o[0] == "failing_step":  # the engine step serving it raises once
                    real = llm.engine.runner.execute
                    llm.engine.runner.execute = _raise
                    try:
                        s.step(list(o[2]) or None, max_tokens=2)
                    finally:
                        llm.engine.runner.execute = real
                    raise AssertionError("the failing step did not fail")
                event(f"{o[0]} ok")
            except SessionEventError as exc:
                assert exc.code in CODES, exc
                event(f"{o[0]} refused: {exc.code}")
            check_accounting(llm)
            for x in sessions:
                if x.status in ("open", "failed"):
                    state = x._rt.state
                    n = len(x.token_ids)
                    assert state.num_kv_tokens in (0, n - 1)
                    if x.status == "open" and n:
                        assert x.routed_experts.shape[0] == n - 1
    finally:
        for x in sessions:
            x.close()
    check_released(llm)
