"""AdmissionControl: the bounded waiting queue as a pure state machine (no engine)."""

from __future__ import annotations

import contextlib
import threading

import pytest

from execstate.engine.admission import AdmissionControl, EngineOverloadedError


def test_admits_whole_requests_up_to_the_bound_then_refuses():
    ac = AdmissionControl(max_waiting=4)
    first = ac.admit(3)
    assert first.slots == 3 and ac.num_waiting == 3
    with pytest.raises(EngineOverloadedError, match="3 requests are waiting") as info:
        ac.admit(2)  # all or nothing: 1 slot is left, 2 are needed
    assert info.value.retry_after_s == 1 and ac.num_waiting == 3
    assert ac.admit(1).slots == 1 and ac.num_waiting == 4
    with pytest.raises(EngineOverloadedError):
        ac.admit(1)


def test_a_request_larger_than_the_queue_is_a_value_error():
    ac = AdmissionControl(max_waiting=4)
    with pytest.raises(ValueError, match="needs 5 engine requests.*--max-waiting-requests"):
        ac.admit(5)
    with_slots = AdmissionControl(max_waiting=4, max_running=2)
    with pytest.raises(ValueError, match="more than the 6 the server can hold"):
        with_slots.admit(7)
    with pytest.raises(ValueError, match="at least one"):
        ac.admit(0)
    assert ac.num_waiting == 0


def test_slots_move_to_the_engine_and_come_back_as_it_schedules():
    ac = AdmissionControl(max_waiting=2)
    ticket = ac.admit(2)
    ac.take(ticket)
    ac.on_added(num_waiting=1)  # the engine thread queued it
    assert ticket.slots == 1 and ac.num_waiting == 2
    with pytest.raises(EngineOverloadedError):
        ac.admit(1)
    ac.publish(num_waiting=0)  # a step scheduled it
    assert ac.num_waiting == 1
    ac.release(ticket)  # the caller is done; its unused slot is free again
    assert ticket.slots == 0 and ac.num_waiting == 0
    ac.release(ticket)  # idempotent
    assert ac.num_waiting == 0
    with pytest.raises(RuntimeError, match="no slot left"):
        ac.take(ticket)


def test_free_sequence_slots_do_not_count_as_waiting():
    """A burst that the engine starts running at its next step is not refused: the engine
    publishes its waiting queue minus its free sequence slots."""
    ac = AdmissionControl(max_waiting=2, max_running=4)
    ac.publish(num_waiting=0, num_free_slots=4)  # idle engine, 4 sequence slots
    burst = ac.admit(6)  # 4 will run, 2 wait
    assert ac.num_waiting == 2
    with pytest.raises(EngineOverloadedError):
        ac.admit(1)
    for k in range(1, 7):
        ac.take(burst)
        ac.on_added(num_waiting=k, num_free_slots=4)  # queued; no step has run yet
    ac.release(burst)
    assert ac.num_waiting == 2
    ac.publish(num_waiting=2, num_free_slots=0)  # the step started 4 of them
    assert ac.num_waiting == 2
    ac.publish(num_waiting=0, num_free_slots=2)  # 2 finished, the waiting 2 started
    assert ac.num_waiting == 0 and ac.admit(4).slots == 4


def test_rejected_add_frees_its_slot():
    ac = AdmissionControl(max_waiting=1)
    ticket = ac.admit(1)
    ac.take(ticket)
    ac.on_added(num_waiting=0)  # add_request raised: nothing was queued
    ac.release(ticket)
    assert ac.num_waiting == 0 and ac.admit(1).slots == 1


def test_unbounded_when_no_limit():
    ac = AdmissionControl(max_waiting=None)
    assert ac.admit(10_000).slots == 10_000
    with pytest.raises(ValueError, match=">= 1"):
        AdmissionControl(max_waiting=0)


def test_concurrent_admissions_never_exceed_the_bound():
    ac = AdmissionControl(max_waiting=50)
    admitted: list[int] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(20):
            with contextlib.suppress(EngineOverloadedError):
                admitted.append(ac.admit(1).slots)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 50 and ac.num_waiting == 50
