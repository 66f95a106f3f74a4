"""The fleet soak's error accounting (``execstate_bench.soak_ray.classify``), on a recorded tally (no fleet).

A failed operation is injected only when it was in flight at the kill and touched the killed
replica or learnt no replica; a failure before or after the kill, or one served wholly by another
replica, is unexpected; successes and client-side cuts are neither.
"""

from __future__ import annotations

import asyncio

import httpx

from execstate_bench.soak_ray import FleetSoak, classify, failed
from execstate_bench.soak_record import Tally

KILL = {"t_kill": 10.0, "victim": "A"}


def soak_with(ops: list[tuple[float, float, str, str, set[str]]]) -> FleetSoak:
    """A soak whose tally holds ``ops``: (start, end, surface, outcome, replicas its answers named)."""
    s = FleetSoak("http://x", ("k1", "k2"), Tally(), 0.0, httpx.AsyncClient())
    for start, end, surface, outcome, reps in ops:
        s.tally.add(end, surface, end - start, outcome)
        s.op_replicas.append(frozenset(reps))
    return s


def test_failed_outcomes():
    assert all(failed(o) for o in ("500", "503", "server_error", "replica_failed", "closed", "http:ReadError",
                                   "connect:ConnectionRefusedError", "ws:InvalidMessage", "engine_dead"))
    assert not any(failed(o) for o in ("200", "ok", "cut", "429", "413", "401", "refused", "wrong_version_tokens"))


def test_injected_only_in_flight_at_the_kill_and_on_the_victim():
    s = soak_with([
        (9.0, 12.0, "completions_sse", "replica_failed", {"A"}),  # cut by the kill: injected
        (9.5, 11.0, "realtime", "closed", set()),  # a socket (no replica learnt), in flight: injected
        (9.9, 10.5, "sessions_http", "503", {"B", "A"}),  # touched the victim: injected
        (9.0, 12.0, "chat_sse", "replica_failed", {"B"}),  # only the other replica: unexpected
        (10.5, 11.0, "completions", "502", set()),  # sent after the kill: unexpected
        (2.0, 3.0, "completions", "500", {"A"}),  # long before: unexpected
        (9.0, 12.0, "completions", "200", {"A"}),  # in flight, succeeded: neither
        (9.0, 12.0, "completions_cut", "cut", {"A"}),  # the client left on purpose: neither
    ])
    out = classify(s, KILL)
    assert out["in_flight_at_kill"] == 6
    assert [(r["surface"], r["outcome"]) for r in out["injected"]] == [
        ("completions_sse", "replica_failed"), ("realtime", "closed"), ("sessions_http", "503")]
    assert [(r["t"], r["outcome"]) for r in out["unexpected"]] == [(12.0, "replica_failed"), (11.0, "502"),
                                                                   (3.0, "500")]


def test_without_a_kill_every_failure_is_unexpected():
    s = soak_with([(9.0, 12.0, "completions_sse", "replica_failed", {"A"}), (1.0, 2.0, "completions", "200", set())])
    out = classify(s, None)
    assert out["in_flight_at_kill"] == 0 and out["injected"] == [] and len(out["unexpected"]) == 1


def test_each_operation_keeps_the_replicas_its_own_task_saw():
    s = soak_with([])

    async def op(name: str, replicas: list[str]) -> None:
        for r in replicas:
            s.saw(r)
            await asyncio.sleep(0)  # interleaved with the other operation
        s.record(name, 0.0, 200)

    async def both() -> None:
        await asyncio.gather(op("one", ["A", "A"]), op("two", ["B", "C", "B"]))

    asyncio.run(both())
    assert dict(zip((o.surface for o in s.tally.ops), s.op_replicas, strict=True)) == {
        "one": frozenset({"A"}), "two": frozenset({"B", "C"})}
