"""Hypothesis against a real server: random sequences of valid, out-of-order and malformed
messages, sent back to back on one connection. Every message gets at least one answer (an
acknowledgement, a response or an error with its event_id), every response exactly one
``response.done`` after all its deltas, no internal error, the server never closes the
connection, ``/health`` stays 200, and closing the connection releases everything."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from realtime_helpers import client, wait_released

# Codes a client may see; anything else (server_error above all) is a bug.
KNOWN_CODES = {
    "invalid_message", "unknown_type", "message_too_large", "no_session", "session_exists", "response_in_progress",
    "no_response", "session_in_use", "invalid", "stale", "backpressure", "closed", "failed", "evicted", "capacity",
    "busy", "not_found", "stale_state",
}
SMALL_IDS = st.lists(st.integers(3, 300), min_size=1, max_size=5)
CHECKPOINTS = st.sampled_from(["cp-1", "cp-2", "cp-3", "nope"])

CREATE = st.builds(lambda s: {"type": "session.create", "session": s}, st.sampled_from([
    {}, {"id": "fz"}, {"sampling": {"temperature": 0.5, "seed": 1}, "max_tokens": 3},
    {"return_routes": True, "max_tokens": 2}, {"sampling": {"temperature": -1}}]))
RESPOND = st.builds(lambda inp, mt: {"type": "response.create", **({"input": inp} if inp else {}),
                                     **({"max_tokens": mt} if mt is not None else {})},
                    st.one_of(st.none(), SMALL_IDS.map(lambda ids: {"token_ids": ids}), st.just({"text": "hi"}),
                              st.just({"bad": 1})),
                    st.one_of(st.none(), st.integers(0, 4)))
SUBMIT = st.builds(lambda eid, kind, data: {"type": "event.submit", "event_id": eid, "kind": kind, "data": data},
                   st.integers(0, 5), st.sampled_from(["input", "sampling", "composite", "bogus"]),
                   st.one_of(SMALL_IDS.map(lambda ids: {"token_ids": ids}), st.just({"text": "hi"}),
                             st.just({"temperature": 0.2}),
                             st.just({"events": [{"kind": "input", "data": {"text": "a"}}]}), st.just(None)))
FORK = st.builds(lambda cp, sid: {"type": "session.fork", **({"checkpoint_id": cp} if cp else {}),
                                  **({"session_id": sid} if sid else {})},
                 st.one_of(st.none(), CHECKPOINTS), st.one_of(st.none(), st.just("fz-fork")))
# One strategy per message type; the ones that make state (steps, events, forks) several times.
valid = st.one_of(
    CREATE, RESPOND, RESPOND, RESPOND, SUBMIT, SUBMIT, FORK, FORK,
    st.builds(lambda sid: {"type": "session.resume", "session_id": sid}, st.sampled_from(["fz", "fz-fork", "nope"])),
    st.just({"type": "session.get"}),
    st.just({"type": "response.cancel"}),
    st.just({"type": "session.checkpoint"}), st.just({"type": "session.checkpoint"}),
    st.builds(lambda cp: {"type": "session.rollback", "checkpoint_id": cp}, CHECKPOINTS),
    st.just({"type": "session.reset"}),
    st.builds(lambda cp: {"type": "checkpoint.release", "checkpoint_id": cp}, CHECKPOINTS),
    st.just({"type": "session.close"}),
)
# Malformed frames: (frame, whether the server can read an event_id from it)
garbage = st.one_of(
    st.binary(max_size=16).map(lambda b: (b, False)),
    st.sampled_from(["", "nope", "{", "[1, 2]", "null", '"text"']).map(lambda t: (t, False)),
    st.sampled_from([{"type": "session.explode"}, {"type": "response.create", "max_tokens": "many"},
                     {"type": "session.rollback"}, {"type": "event.submit", "kind": "input"},
                     {"type": "session.create", "session": {"sampling": {"nope": 1}}},
                     {"type": "response.create", "junk": 1}]).map(lambda d: (d, True)),
)
# Most sequences open a session first (else nearly everything is a no_session error); one
# message in five is malformed.
messages = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from([[], [("c", True)]] + [[("c", False)]] * 3).map(
        lambda f: [({"type": "session.create", "session": {"id": "fz"} if f[0][1] else {}}, True)] if f else []),
    st.lists(st.one_of(*[valid.map(lambda m: (m, True))] * 4, garbage.map(lambda g: ("garbage", g))),
             min_size=1, max_size=14),
)


async def exchange(url: str, plan) -> tuple[list[tuple[object, object]], list[dict]]:
    sent: list[tuple[object, object]] = []  # (frame, the event_id its answer carries)
    async with client(url) as c:
        for i, (a, b) in enumerate(plan):
            if a == "garbage":
                frame, readable = b
                if isinstance(frame, dict):
                    frame = json.dumps({**frame, "event_id": f"g{i}"} if readable else frame)
                sent.append((frame, f"g{i}" if readable and not isinstance(frame, bytes) else None))
            else:
                msg = dict(a)
                if msg["type"] != "event.submit":
                    msg["event_id"] = f"m{i}"
                sent.append((msg, msg["event_id"]))
            await c.send(sent[-1][0])
        await c.send({"type": "session.get", "event_id": "end"})
        events = []
        open_responses = 0
        while True:
            event = await c.recv()
            events.append(event)
            open_responses += {"response.created": 1, "response.done": -1}.get(event["type"], 0)
            if any(e.get("event_id") == "end" for e in events) and open_responses == 0:
                break
        return sent, events


def check(sent, events) -> None:
    answers = Counter(e["event_id"] for e in events if e["type"] != "response.delta")
    # A response.cancel that finds a response in progress is answered by that response's done.
    wanted = Counter(eid for m, eid in sent if not (isinstance(m, dict) and m.get("type") == "response.cancel"))
    for eid, n in wanted.items():
        if eid is None:
            assert sum(1 for e in events if e["type"] == "error" and e["event_id"] is None) >= n
        else:
            assert answers[eid] >= n, f"{n} message(s) with event_id {eid!r} got {answers[eid]} answer(s)"
    codes = {e["error"]["code"] for e in events if e["type"] == "error"}
    assert codes <= KNOWN_CODES, codes
    for e in events:
        if e["type"] == "response.done" and e["response"]["error"] is not None:
            assert e["response"]["error"]["code"] in KNOWN_CODES
    # each response: created, its deltas, exactly one done, nothing after
    state: dict[str, str] = {}
    for e in events:
        if e["type"] == "response.created":
            assert e["response"]["id"] not in state
            state[e["response"]["id"]] = "open"
        elif e["type"] == "response.delta":
            assert state.get(e["response_id"]) == "open"
        elif e["type"] == "response.done":
            assert state.get(e["response"]["id"]) == "open"
            state[e["response"]["id"]] = "done"
    assert all(v == "done" for v in state.values())
    cancels_answered_by_done = [m for m, eid in sent if isinstance(m, dict) and m.get("type") == "response.cancel"
                                and not any(e["type"] == "error" and e["event_id"] == eid for e in events)]
    assert not cancels_answered_by_done or state


def run_plan(served, plan) -> None:
    sent, events = asyncio.run(exchange(served.url, plan))
    check(sent, events)
    wait_released(served.sessions)
    assert served.app.state.realtime.owners.num_sessions == 0
    assert httpx.get(served.url + "/health").status_code == 200


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages)
def test_random_message_sequences(served, plan):
    run_plan(served, plan)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=1).map(lambda x: x[0]))
def test_random_message_sequences_long(served, plan):
    run_plan(served, plan)
