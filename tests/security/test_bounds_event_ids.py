"""Finding 7: an ``event_id`` of 10**30 was accepted (HTTP and the sockets), and a later
migration of that session failed with a plain-text 500 (``OverflowError`` in the offer encoder:
msgpack integers stop at 2**64-1). Now a session event id is an integer in [0, 2**63-1] on every
surface (the session runtime's queue refuses the rest: ``invalid``), and a message's echo
``event_id`` is an integer of int64's range or a string of 1-128 characters (the realtime
framework: ``invalid_message``). Every id the queue accepts fits the migration wire."""

from __future__ import annotations

import asyncio

import httpx
import msgspec
import pytest
from bounds_server import Raw, bounds_served, connect_raw, error_code  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.session.runtime.events import EventKind, EventQueue, Merge, SessionEventError
from execstate.session.runtime.migration_wire import WireEvents, events_to_wire

TOP = 2**63 - 1
KINDS = {"note": EventKind("note", Merge.APPEND, lambda d: d)}


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-(2**70), -1), st.integers(TOP + 1, 10**40)))
def test_queue_refuses_ids_outside_int64(event_id):
    q = EventQueue(KINDS)
    with pytest.raises(SessionEventError) as e:
        q.submit(event_id, "note", 1)
    assert e.value.code == "invalid" and "2**63-1" in e.value.message
    assert q.last_event_id is None and q.num_pending == 0  # nothing changed


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, TOP), min_size=1, max_size=5, unique=True))
def test_every_accepted_id_fits_the_migration_wire(ids):
    q = EventQueue(KINDS)
    for i in sorted(ids):
        q.submit(i, "note", {"i": i})
    wire = events_to_wire(q.snapshot(), lambda e: e.data)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(wire), type=WireEvents)  # the offer's encoding
    assert back.last_event_id == max(ids) and [p.event_id for p in back.pending] == sorted(ids)


def test_http_event_id_beyond_int64_is_400_invalid(bounds_served):  # noqa: F811
    url = bounds_served.url
    sid = httpx.post(f"{url}/v1/sessions", json={}, timeout=30).json()["session_id"]
    try:
        for eid in (10**30, 2**63, -1):
            r = httpx.post(f"{url}/v1/sessions/{sid}/events", json={"event_id": eid, "kind": "input",
                                                                   "data": {"token_ids": [1]}}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid", (eid, r.text)
        ok = httpx.post(f"{url}/v1/sessions/{sid}/events", json={"event_id": TOP, "kind": "input",
                                                                "data": {"token_ids": [1]}}, timeout=30)
        assert ok.status_code == 200 and ok.json()["event_id"] == TOP, ok.text
    finally:
        httpx.delete(f"{url}/v1/sessions/{sid}", timeout=30)


@pytest.mark.parametrize("kind", ["lm", "agent", "world"])
def test_socket_echo_ids_are_bounded(bounds_served, kind):  # noqa: F811
    probe = {"lm": "session.get", "agent": "session.close", "world": "session.ping"}[kind]

    async def run() -> None:
        async with connect_raw(bounds_served, kind) as ws:
            c = Raw(ws)
            for bad in (10**30, -(2**63) - 1, "x" * 129, ""):
                event = await c.ask({"type": probe, "event_id": bad})
                assert error_code(event) == "invalid_message" and event["event_id"] is None, (bad, event)
            for good in (TOP, -(2**63), "x" * 128):
                event = await c.ask({"type": probe, "event_id": good})
                assert event["event_id"] == good and error_code(event) != "invalid_message", (good, event)

    asyncio.run(run())


def test_realtime_session_event_id_beyond_int64_is_refused(bounds_served):  # noqa: F811
    async def run() -> None:
        async with connect_raw(bounds_served, "lm") as ws:
            c = Raw(ws)
            assert (await c.ask({"type": "session.create", "session": {}}))["type"] == "session.created"
            event = await c.ask({"type": "event.submit", "event_id": 10**30, "kind": "input",
                                 "data": {"token_ids": [1]}})
            assert error_code(event) in ("invalid_message", "invalid"), event
            ok = await c.ask({"type": "event.submit", "event_id": TOP, "kind": "input", "data": {"token_ids": [1]}})
            assert ok["type"] == "event.accepted" and ok["event_id"] == TOP, ok
            assert (await c.ask({"type": "session.close"}))["type"] == "session.closed"

    asyncio.run(run())
