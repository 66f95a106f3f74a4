"""Events of an LM session: monotonic ids, applied only at a step boundary, duplicates
idempotent, stale ids refused, a bounded queue (``max_session_events``) refuses with backpressure,
composite events applied whole or refused whole, last write wins per kind within one step (the
overwritten event listed as completed)."""

from __future__ import annotations

import pytest
from session_helpers import GREEDY, check_released, generate, make_llm, tokens

from execstate import SamplingParams
from execstate.session.runtime.events import SessionEventError


def code(fn) -> str:
    with pytest.raises(SessionEventError) as ei:
        fn()
    return ei.value.code


def test_input_events_are_applied_at_the_next_boundary_in_id_order(moe_dir):
    llm, cold = make_llm(moe_dir), make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    a, b = tokens(10, 12), tokens(11, 7)
    ack = s.submit_event(event_id=3, kind="input", data={"token_ids": a})
    assert (ack.event_id, ack.kind, ack.status, ack.duplicate) == (3, "input", "accepted", False)
    s.submit_event(event_id=9, kind="input", data={"token_ids": b})
    assert s.token_ids == []  # accepted, not applied
    r = s.step(max_tokens=4)
    assert r.events == {"started": [3, 9], "active": [], "completed": [3, 9]}
    assert s.token_ids[:19] == a + b and r.token_ids == generate(cold, a + b, max_tokens=4).token_ids
    r2 = s.step([5, 6], max_tokens=2)  # the shorthand takes the next id above the watermark
    assert r2.events["started"] == [10]
    s.close()
    check_released(llm)


def test_duplicates_stale_ids_backpressure_and_bad_payloads(moe_dir):
    llm = make_llm(moe_dir, max_session_events=2)
    s = llm.open_session(sampling_params=GREEDY)
    first = s.submit_event(5, "input", {"token_ids": [7, 8]})
    again = s.submit_event(5, "input", {"token_ids": [99]})
    assert again == first and again.duplicate
    assert code(lambda: s.submit_event(4, "input", {"token_ids": [1]})) == "stale"
    s.submit_event(6, "input", {"token_ids": [9]})
    assert code(lambda: s.submit_event(7, "input", {"token_ids": [1]})) == "backpressure"
    s.step(max_tokens=1)
    assert s.token_ids[:3] == [7, 8, 9]  # the duplicate was applied once
    s.submit_event(7, "input", {"token_ids": [1]})  # room again after the boundary
    for bad in ({"token_ids": [10**6]}, {"token_ids": "x"}, {"tokens": [1]}, {"token_ids": [1], "text": "a"},
                {"token_ids": [True]}):
        assert code(lambda bad=bad: s.submit_event(20, "input", bad)) == "invalid"
    assert code(lambda: s.submit_event(20, "nope", {})) == "invalid"
    assert code(lambda: s.submit_event(-1, "input", {"token_ids": [1]})) == "invalid"
    assert code(lambda: s.submit_event(20, "sampling", {"seed": 3})) == "invalid"  # fixed per session
    assert code(lambda: s.submit_event(20, "sampling", {"temperature": -1})) == "invalid"
    s.close()
    assert code(lambda: s.submit_event(30, "input", {"token_ids": [1]})) == "closed"
    check_released(llm)


def test_composite_events_are_applied_whole_or_refused_whole(moe_dir):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    bad = {"events": [{"kind": "input", "data": {"token_ids": [4, 5]}},
                      {"kind": "sampling", "data": {"temperature": "hot"}}]}
    assert code(lambda: s.submit_event(1, "composite", bad)) == "invalid"
    assert s.info().num_pending_events == 0 and s.info().last_event_id is None  # nothing of it queued
    good = {"events": [{"kind": "input", "data": {"token_ids": [4, 5]}},
                       {"kind": "sampling", "data": {"max_tokens": 3}}]}
    s.submit_event(1, "composite", good)
    r = s.step()
    assert s.token_ids[:2] == [4, 5] and len(r.token_ids) == 3 and r.events["started"] == [1]
    s.close()


def test_last_write_wins_per_kind_and_the_overwritten_event_is_completed(moe_dir):
    llm, cold = make_llm(moe_dir), make_llm(moe_dir)
    s = llm.open_session(sampling_params=SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    s.submit_event(1, "sampling", {"max_tokens": 9})
    s.submit_event(2, "input", {"token_ids": tokens(12, 6)})
    s.submit_event(3, "sampling", {"max_tokens": 4})  # overwrites 1 within this step
    r = s.step()
    assert len(r.token_ids) == 4
    assert r.events == {"started": [2, 3], "active": [], "completed": [1, 2, 3]}
    assert len(s.step().token_ids) == 4  # the applied sampling event holds for later steps
    assert s.token_ids[6:10] == generate(cold, tokens(12, 6), max_tokens=4).token_ids
    s.close()


def test_context_overflow_is_refused_at_the_boundary_and_the_events_stay(moe_dir):
    llm = make_llm(moe_dir, max_model_len=64)
    s = llm.open_session(sampling_params=GREEDY)
    s.step(tokens(13, 40), max_tokens=10)
    assert code(lambda: s.step(tokens(14, 20), max_tokens=1)) == "invalid"  # 50 + 20 > 63
    info = s.info()
    assert info.status == "open" and info.num_pending_events == 1 and info.step_index == 1
    assert code(lambda: s.step(max_tokens=1)) == "invalid"  # still pending: refused again, state intact
    assert len(s.token_ids) == 50
    s.close()
    check_released(llm)
