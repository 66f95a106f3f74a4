"""Capacity, eviction, isolation and scheduling priority of LM sessions."""

from __future__ import annotations

from dataclasses import replace

import pytest
from session_helpers import GREEDY, SAMPLED, check_accounting, check_released, generate, make_llm, tokens

from execstate.engine.scheduler import PRIORITY_BATCH
from execstate.session.runtime.events import SessionEventError


def code(fn) -> str:
    with pytest.raises(SessionEventError) as ei:
        fn()
    return ei.value.code


def test_capacity_refuses_clearly_without_eviction(moe_dir):
    llm = make_llm(moe_dir, max_sessions=2)
    a, b = llm.open_session(session_id="a"), llm.open_session()
    with pytest.raises(SessionEventError) as ei:
        llm.open_session()
    assert ei.value.code == "capacity" and "max_sessions=2" in ei.value.message
    assert code(lambda: llm.open_session(session_id="a b")) == "invalid"
    a.close()
    c = llm.open_session(session_id="a")  # an ended session's id may be reused
    for s in (b, c):
        s.close()
    check_released(llm)


def test_lru_eviction_releases_the_idle_session_with_the_oldest_step(moe_dir):
    llm = make_llm(moe_dir, max_sessions=2, session_eviction="lru")
    pool = llm.engine.block_pool
    a, b = llm.open_session(sampling_params=GREEDY), llm.open_session(sampling_params=GREEDY)
    a.step(tokens(40, 30))
    a.checkpoint()
    b.step(tokens(41, 30))
    a.step([5])  # a stepped last: b is the least recently used
    used_by_b = len(b._rt.state.blocks.block_ids)
    before = pool.num_used
    c = llm.open_session()
    assert b.status == "evicted" and a.status == "open"
    assert pool.num_used == before - used_by_b
    with pytest.raises(SessionEventError) as ei:
        b.step([1])
    assert ei.value.code == "evicted" and "least recently used" in ei.value.message
    b.close()
    for s in (a, c):
        s.close()
    check_released(llm)


def test_kv_pressure_evicts_idle_sessions_or_fails_the_request_clearly(moe_dir):
    for eviction in ("lru", None):
        llm = make_llm(moe_dir, num_kv_blocks=16, max_model_len=128, session_eviction=eviction)
        sessions = [llm.open_session(sampling_params=GREEDY) for _ in range(3)]
        for i, s in enumerate(sessions):
            s.step(tokens(42 + i, 60), max_tokens=4)  # 4 blocks each: 12 of 16 held
        out = llm.generate({"prompt_token_ids": tokens(50, 90)}, GREEDY, use_tqdm=False)[0]  # needs 6
        if eviction == "lru":
            assert (
                out.error is None and out.outputs[0].token_ids == generate(make_llm(moe_dir), tokens(50, 90)).token_ids
            )
            assert [s.status for s in sessions] == ["evicted", "open", "open"]  # the oldest step went
        else:
            assert out.outputs[0].finish_reason == "abort" and "sessions and checkpoints hold" in out.error
            assert [s.status for s in sessions] == ["open"] * 3
        check_accounting(llm)
        for s in sessions:
            s.close()
        check_released(llm)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_interleaved_sessions_equal_each_alone(moe_dir, params):
    turns_a = [tokens(60, 25), tokens(61, 4), tokens(62, 9)]
    turns_b = [tokens(63, 18), tokens(64, 7), tokens(65, 3)]
    alone = {}
    for name, turns in (("a", turns_a), ("b", turns_b)):
        solo = make_llm(moe_dir)
        s = solo.open_session(sampling_params=params)
        alone[name] = [s.step(t).token_ids for t in turns], s.routed_experts
    llm = make_llm(moe_dir)
    sessions = llm.sessions
    sessions.open("a", params)
    sessions.open("b", params)
    got = {"a": [], "b": []}
    for ta, tb in zip(turns_a, turns_b, strict=True):
        # both steps in flight together: they share every engine step (batched)
        ha, hb = sessions.start_step("a", ta), sessions.start_step("b", tb)
        while not (ha.done and hb.done):
            llm.engine.step()
        got["a"].append(ha.result.token_ids)
        got["b"].append(hb.result.token_ids)
    for name in ("a", "b"):
        assert got[name] == alone[name][0]
        assert sessions.routed_experts(name).tobytes() == alone[name][1].tobytes()
    sessions.close("a")
    sessions.close("b")
    check_released(llm)


def run_until_admitted(llm, handle_request_id: str) -> list[str]:
    """Step the engine once; return the ids scheduled in that step, in order."""
    seen: list[str] = []
    real = llm.engine.scheduler.schedule

    def spy():
        out = real()
        seen.extend(s.request.request_id for s in out.scheduled)
        return out

    llm.engine.scheduler.schedule = spy
    try:
        llm.engine.step()
    finally:
        del llm.engine.scheduler.schedule
    return seen


@pytest.mark.parametrize("priority", ["interactive", "batch"])
def test_a_session_step_is_scheduled_ahead_of_queued_batch_requests(moe_dir, priority):
    llm = make_llm(moe_dir, max_num_seqs=2)
    eng = llm.engine
    sessions = llm.sessions
    sessions.open("s", GREEDY, priority=PRIORITY_BATCH if priority == "batch" else 1)
    for i in range(4):
        eng.add_request(tokens(70 + i, 12), GREEDY, f"batch-{i}")
    eng.step()  # batch-0 and batch-1 run, batch-2 and batch-3 wait
    handle = sessions.start_step("s", tokens(80, 10), max_tokens=2)
    scheduled = run_until_admitted(llm, handle.request_id)
    waiting = [r.request_id for r in eng.scheduler.waiting]
    if priority == "interactive":
        assert scheduled[0] == handle.request_id  # admitted at once, first in the step
        assert waiting == ["batch-1", "batch-2", "batch-3"]  # the newest running batch request yielded its slot
    else:
        assert handle.request_id not in scheduled and waiting[-1] == handle.request_id  # behind the batch queue
    while not handle.done:
        eng.step()
    while eng.has_unfinished_requests():
        eng.step()
    assert handle.result.token_ids == generate(make_llm(moe_dir), tokens(80, 10), max_tokens=2).token_ids
    sessions.close("s")
    check_released(llm)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_preempted_session_step_recomputes_to_the_same_tokens_routes_and_rng(moe_dir, params):
    prompt = tokens(100, 30)
    solo = make_llm(moe_dir).open_session(sampling_params=params)
    alone = solo.step(prompt, max_tokens=20), solo.step([7, 8], max_tokens=4), solo.routed_experts
    llm = make_llm(moe_dir, num_kv_blocks=6, max_model_len=64)  # the step and the batch request do not fit together
    eng = llm.engine
    sessions = llm.sessions
    sessions.open("s", params, priority=PRIORITY_BATCH)  # same class as the batch request: the newer one yields
    eng.add_request(tokens(101, 30), replace(GREEDY, max_tokens=30), "batch")
    eng.step()
    handle = sessions.start_step("s", prompt, max_tokens=20)
    req = eng.requests[handle.request_id]  # the engine request of the step (the engine's own; a white-box read)
    while not handle.done:
        eng.step()
    assert req.num_preemptions > 0  # freed, then recomputed (prefix cache hits where it could)
    assert handle.result.token_ids == alone[0].token_ids
    nxt = sessions.start_step("s", [7, 8], max_tokens=4)  # the RNG went on from the same state
    while not nxt.done:
        eng.step()
    assert nxt.result.token_ids == alone[1].token_ids
    assert sessions.routed_experts("s").tobytes() == alone[2].tobytes()
    while eng.has_unfinished_requests():
        eng.step()
    sessions.close("s")
    check_released(llm)
