"""The event queue without a model: ids, duplicates, stale ids, backpressure, composites,
per-kind merging, snapshots; plus a hypothesis state-machine check against a tiny model of
the rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.session.runtime.events import (
    EventKind,
    EventQueue,
    Merge,
    SessionEventError,
)


def _tokens(data):
    if not isinstance(data, dict) or not isinstance(data.get("token_ids"), list):
        raise ValueError("data must be {'token_ids': [...]}")
    if not all(isinstance(t, int) and t >= 0 for t in data["token_ids"]):
        raise ValueError("token_ids must be non-negative integers")
    return tuple(data["token_ids"])


def _temp(data):
    if not isinstance(data, dict) or not isinstance(data.get("t"), int | float):
        raise ValueError("data must be {'t': number}")
    return float(data["t"])


KINDS = {"input": EventKind("input", Merge.APPEND, _tokens), "sampling": EventKind("sampling", Merge.REPLACE, _temp)}


def q(**kw) -> EventQueue:
    return EventQueue(KINDS, **kw)


def code_of(fn) -> str:
    with pytest.raises(SessionEventError) as ei:
        fn()
    return ei.value.code


def test_accept_then_apply_only_at_drain():
    e = q()
    ack = e.submit(3, "input", {"token_ids": [1, 2]})
    assert (ack.event_id, ack.kind, ack.status, ack.duplicate) == (3, "input", "accepted", False)
    assert e.num_pending == 1 and e.last_event_id == 3
    d = e.drain()
    assert [(x.event_id, x.data) for x in d.applied] == [(3, (1, 2))]
    assert d.overwritten == () and e.num_pending == 0
    assert e.drain().applied == ()  # applied once


def test_duplicate_returns_same_ack_and_is_applied_once():
    e = q()
    first = e.submit(1, "input", {"token_ids": [5]})
    again = e.submit(1, "input", {"token_ids": [5]})
    assert again == first and again.duplicate
    assert [x.data for x in e.drain().applied] == [(5,)]
    assert e.submit(1, "input", {"token_ids": [5]}) == first  # still a duplicate after it was applied
    assert e.drain().applied == ()


def test_stale_and_invalid_ids():
    e = q()
    e.submit(10, "input", {"token_ids": [1]})
    assert code_of(lambda: e.submit(9, "input", {"token_ids": [1]})) == "stale"
    for bad in (-1, 1.5, "7", True, None):
        assert code_of(lambda bad=bad: e.submit(bad, "input", {"token_ids": [1]})) == "invalid"
    assert e.num_pending == 1 and e.last_event_id == 10


def test_invalid_kind_or_payload_changes_nothing():
    e = q()
    assert code_of(lambda: e.submit(1, "nope", {})) == "invalid"
    assert code_of(lambda: e.submit(1, "input", {"token_ids": [-3]})) == "invalid"
    assert e.num_pending == 0 and e.last_event_id is None
    e.submit(1, "input", {"token_ids": [0]})  # the id was not consumed by the refusals


def test_backpressure_bound():
    e = q(max_pending=2)
    e.submit(1, "input", {"token_ids": [1]})
    e.submit(2, "input", {"token_ids": [2]})
    err = pytest.raises(SessionEventError, e.submit, 3, "input", {"token_ids": [3]}).value
    assert err.code == "backpressure" and err.event_id == 3
    e.drain()
    e.submit(3, "input", {"token_ids": [3]})  # room again, and 3 was not consumed


def test_composite_whole_or_nothing():
    e = q()
    good = {"events": [{"kind": "input", "data": {"token_ids": [1]}}, {"kind": "sampling", "data": {"t": 0.5}}]}
    bad = {"events": [{"kind": "input", "data": {"token_ids": [1]}}, {"kind": "sampling", "data": {"t": "hot"}}]}
    assert code_of(lambda: e.submit(1, "composite", bad)) == "invalid"
    assert e.num_pending == 0
    for junk in (None, {}, {"events": []}, {"events": [1]}, {"events": [{"kind": "composite", "data": good}]}):
        assert code_of(lambda junk=junk: e.submit(1, "composite", junk)) == "invalid"
    e.submit(1, "composite", good)
    assert e.num_pending == 1
    d = e.drain()
    assert [(x.event_id, x.kind, x.part, x.data) for x in d.applied] == [(1, "input", 0, (1,)), (1, "sampling", 1, 0.5)]


def test_last_write_wins_per_kind_overwritten_reported():
    e = q()
    e.submit(1, "sampling", {"t": 0.1})
    e.submit(2, "input", {"token_ids": [1]})
    e.submit(3, "sampling", {"t": 0.9})
    e.submit(4, "input", {"token_ids": [2]})
    d = e.drain()
    assert [(x.event_id, x.data) for x in d.applied] == [(2, (1,)), (3, 0.9), (4, (2,))]
    assert [x.event_id for x in d.overwritten] == [1]
    assert d.event_ids == [1, 2, 3, 4]


def test_snapshot_restore_rewinds_ids_and_pending():
    e = q()
    e.submit(1, "input", {"token_ids": [1]})
    snap = e.snapshot()
    e.drain()
    e.submit(2, "input", {"token_ids": [2]})
    e.restore(snap)
    assert e.num_pending == 1 and e.last_event_id == 1
    e.submit(2, "input", {"token_ids": [2]})  # the same id again is new after a rollback, not a duplicate
    assert [x.data for x in e.drain().applied] == [(1,), (2,)]


def test_closed_refuses():
    e = q()
    e.submit(1, "input", {"token_ids": [1]})
    e.close()
    assert e.num_pending == 0
    assert code_of(lambda: e.submit(2, "input", {"token_ids": [1]})) == "closed"


def test_remember_is_bounded():
    e = q(remember=2)
    for i in range(1, 5):
        e.submit(i, "input", {"token_ids": [i]})
    assert e.submit(4, "input", {"token_ids": [4]}).duplicate
    assert code_of(lambda: e.submit(1, "input", {"token_ids": [1]})) == "stale"  # forgotten: below the watermark


ops = st.lists(
    st.tuples(
        st.sampled_from(["submit", "drain"]),
        st.integers(-2, 12),
        st.sampled_from(["input", "sampling", "bogus"]),
        st.integers(0, 3),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(1, 4))
def test_queue_matches_reference_model(seq, max_pending):
    """Against a direct model of the rules: every accepted id is applied or overwritten exactly
    once, in id order; refusals have the right code and change nothing."""
    e = q(max_pending=max_pending)
    accepted: set[int] = set()
    taken: list[int] = []
    last = None
    pending = 0
    for op, eid, kind, v in seq:
        if op == "drain":
            d = e.drain()
            ids = d.event_ids
            assert ids == sorted(ids)
            taken += ids
            pending = 0
            continue
        data = {"token_ids": [v]} if kind == "input" else {"t": v}
        if eid < 0:
            expect = "invalid"
        elif eid in accepted:
            expect = "dup"
        elif last is not None and eid <= last:
            expect = "stale"
        elif kind == "bogus":
            expect = "invalid"
        elif pending >= max_pending:
            expect = "backpressure"
        else:
            expect = "ok"
        if expect in ("ok", "dup"):
            ack = e.submit(eid, kind, data)
            assert ack.duplicate == (expect == "dup")
            if expect == "ok":
                accepted.add(eid)
                last = eid
                pending += 1
        else:
            assert code_of(lambda eid=eid, kind=kind, data=data: e.submit(eid, kind, data)) == expect
    taken += e.drain().event_ids
    assert sorted(taken) == sorted(accepted) and len(taken) == len(set(taken))
