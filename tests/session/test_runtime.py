"""The generic session runtime and manager without a model: status machine, step index, event
epoch, checkpoints of an opaque kind state, reset, fork, capacity and LRU eviction, release once.

The kind here is a counter (``FakeState``): its value is what a step computes; ``save`` pins a
"resource" whose releases are counted, so leaks and double releases show up.
"""

from __future__ import annotations

from collections import Counter

import pytest

from execstate.identity.execution import ExecutionIdentity
from execstate.identity.provenance import Provenance
from execstate.session.runtime.events import EventKind, EventQueue, Merge, SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.session.runtime.manager import SessionManager, check_session_id

ROOT = ExecutionIdentity(Provenance(model_id="m", weights_version="w", dtype="float32",
                                    numerics="eager+torch-cpu")).root
KINDS = {"add": EventKind("add", Merge.APPEND, int), "set": EventKind("set", Merge.REPLACE, int)}


class Pins:
    def __init__(self) -> None:
        self.live: Counter[int] = Counter()
        self.next = 0

    def pin(self) -> int:
        self.next += 1
        self.live[self.next] += 1
        return self.next

    def release(self, pin: int) -> None:
        assert self.live[pin] == 1, f"pin {pin} released twice"
        self.live[pin] -= 1

    @property
    def held(self) -> int:
        return sum(self.live.values())


class FakeSaved:
    def __init__(self, pins: Pins, value: int) -> None:
        self.pins, self.value, self.pin = pins, value, pins.pin()

    def release(self) -> None:
        self.pins.release(self.pin)


class FakeState:
    def __init__(self, pins: Pins, value: int = 0) -> None:
        self.pins, self.value, self.pin = pins, value, pins.pin()

    def save(self) -> FakeSaved:
        return FakeSaved(self.pins, self.value)

    def restore(self, saved: FakeSaved) -> None:
        self.value = saved.value

    def clone(self, saved: FakeSaved | None) -> FakeState:
        return FakeState(self.pins, self.value if saved is None else saved.value)

    def release(self) -> None:
        if self.pin is not None:
            self.pins.release(self.pin)
            self.pin = None

    def chain(self):
        return ROOT, [self.value]


def session(pins: Pins, sid: str = "s", max_pending: int = 8) -> SessionRuntime:
    return SessionRuntime(sid, FakeState(pins), EventQueue(KINDS, max_pending), branch_id=f"b-{sid}")


def run_step(rt: SessionRuntime, ok: bool = True) -> None:
    """A step of the fake kind: add every 'add', then apply 'set' (last write wins)."""

    def prepare(drained):
        for e in drained.applied:
            if e.kind == "add":
                rt.state.value += e.data
            else:
                rt.state.value = e.data
        return drained

    rt.begin_step(prepare)
    assert rt.status is SessionStatus.STEPPING
    rt.end_step(ok, None if ok else "boom")


def code(fn) -> str:
    with pytest.raises(SessionEventError) as ei:
        fn()
    return ei.value.code


def test_steps_count_from_one_and_epochs_advance_only_with_events():
    pins = Pins()
    rt = session(pins)
    assert (rt.step_index, rt.event_epoch) == (0, 0)
    run_step(rt)  # no events
    assert (rt.step_index, rt.event_epoch, rt.state.value) == (1, 0, 0)
    rt.submit_event(1, "add", 5)
    rt.submit_event(2, "add", 2)
    assert rt.state.value == 0  # accepted, not applied
    run_step(rt)
    assert (rt.step_index, rt.event_epoch, rt.state.value) == (2, 1, 7)


def test_status_machine_refusals():
    pins = Pins()
    rt = session(pins)
    rt.begin_step(lambda d: None)
    assert rt.submit_event(1, "add", 1).status == "accepted"  # queued during a step
    assert code(lambda: rt.begin_step(lambda d: None)) == "busy"
    assert code(rt.checkpoint) == "busy"
    assert code(lambda: rt.fork_parts(None)) == "busy"
    rt.end_step(False, "boom")
    assert rt.status is SessionStatus.FAILED and rt.step_index == 0 and rt.error == "boom"
    for call in (rt.checkpoint, lambda: rt.submit_event(2, "add", 1), lambda: rt.begin_step(lambda d: None),
                 lambda: rt.fork_parts(None)):
        assert code(call) == "failed"
    rt.reset()
    assert rt.status is SessionStatus.OPEN and rt.error is None
    rt.close()
    assert code(rt.checkpoint) == "closed" and code(lambda: rt.submit_event(3, "add", 1)) == "closed"
    assert rt.close() is False  # idempotent
    assert pins.held == 0


def test_a_refused_boundary_leaves_the_events_pending():
    rt = session(Pins())
    rt.submit_event(1, "add", 4)

    def refuse(drained):
        assert [e.event_id for e in drained.applied] == [1]
        raise SessionEventError("invalid", "too long")

    assert code(lambda: rt.begin_step(refuse)) == "invalid"
    assert rt.status is SessionStatus.OPEN and rt.events.num_pending == 1 and rt.event_epoch == 0
    run_step(rt)
    assert rt.state.value == 4


def test_checkpoint_rollback_restores_control_state_and_a_fresh_epoch():
    pins = Pins()
    rt = session(pins)
    rt.submit_event(1, "add", 3)
    run_step(rt)
    rt.submit_event(2, "add", 10)  # pending at the checkpoint
    cp = rt.checkpoint()
    assert (cp.step_index, cp.event_epoch, cp.checkpoint_id) == (1, 1, "cp-1")
    run_step(rt)
    rt.submit_event(3, "set", 100)
    run_step(rt)
    assert (rt.step_index, rt.state.value, rt.event_epoch) == (3, 100, 3)
    rt.rollback(cp)
    assert (rt.step_index, rt.state.value, rt.events.num_pending, rt.events.last_event_id) == (1, 3, 1, 2)
    assert rt.event_epoch == 4  # above every epoch the session had
    run_step(rt)  # the pending event 2 applies again: same step as before the rollback
    assert (rt.step_index, rt.state.value) == (2, 13)
    assert rt.submit_event(2, "add", 1).duplicate  # the restored acknowledgements: a duplicate, applied once
    assert rt.events.num_pending == 0
    rt.close()
    assert pins.held == 0


def test_reset_goes_to_the_newest_live_checkpoint_else_the_origin():
    pins = Pins()
    rt = session(pins)
    rt.submit_event(1, "add", 1)
    run_step(rt)
    cp1 = rt.checkpoint()
    rt.submit_event(2, "add", 1)
    run_step(rt)
    cp2 = rt.checkpoint()
    run_step(rt, ok=False)
    rt.reset()
    assert (rt.step_index, rt.state.value) == (cp2.step_index, 2)
    rt.release_checkpoint(cp2.checkpoint_id)
    assert code(lambda: rt.rollback(cp2)) == "not_found"
    rt.reset()
    assert (rt.step_index, rt.state.value) == (1, 1)
    cp1.release()
    cp1.release()  # idempotent
    rt.reset()
    assert (rt.step_index, rt.state.value, rt.events.last_event_id) == (0, 0, None)
    rt.close()
    assert pins.held == 0


def test_fork_parts_and_foreign_checkpoints():
    pins = Pins()
    a, b = session(pins, "a"), session(pins, "b")
    a.submit_event(1, "add", 7)
    run_step(a)
    cp = a.checkpoint()
    state, events, step, epoch = a.fork_parts(cp)
    assert (state.value, step, epoch, events.last_id) == (7, 1, 1, 1)
    assert code(lambda: b.rollback(cp)) == "invalid"
    state.release()
    a.close()
    b.close()
    assert pins.held == 0


def test_state_key_changes_with_step_epoch_and_branch():
    pins = Pins()
    a, b = session(pins, "a"), session(pins, "b")
    assert a.state_key() != b.state_key()  # same state, other branch
    k0 = a.state_key()
    run_step(a)
    k1 = a.state_key()
    a.submit_event(1, "add", 0)
    run_step(a)
    assert len({k0, k1, a.state_key()}) == 3


def test_close_while_stepping_releases_once_and_end_step_is_then_a_no_op():
    pins = Pins()
    rt = session(pins)
    rt.checkpoint()
    rt.begin_step(lambda d: None)
    rt.close()
    assert pins.held == 0
    rt.end_step(True)
    assert rt.status is SessionStatus.CLOSED and rt.step_index == 0


# -- manager ------------------------------------------------------------------------------------------


def test_session_ids_are_validated():
    assert check_session_id("abc-1_2.3:x") == "abc-1_2.3:x"
    for bad in ("", "a b", "x" * 129, "é", None, 5):
        assert code(lambda bad=bad: check_session_id(bad)) == "invalid"


def test_capacity_without_eviction_refuses():
    m = SessionManager(max_sessions=2)
    pins = Pins()
    for sid in ("a", "b"):
        m.add(session(pins, m.admit(sid)))
    assert code(lambda: m.admit("c")) == "capacity"
    assert code(lambda: m.admit("a")) == "invalid"  # resident id
    m.close("a")
    m.add(session(pins, m.admit("c")))
    assert m.get("a").status is SessionStatus.CLOSED  # remembered: "closed", not "not_found"
    assert code(lambda: m.get("zz")) == "not_found"
    m.close_all()
    assert pins.held == 0 and m.num_resident == 0


def test_lru_eviction_takes_the_idle_session_with_the_oldest_step():
    m = SessionManager(max_sessions=3, eviction="lru")
    pins = Pins()
    a, b, c = (m.add(session(pins, m.admit(s))) for s in "abc")
    a.last_active = m.tick()  # a stepped most recently; b is the oldest idle one
    c.begin_step(lambda d: None)  # stepping: never a victim
    m.add(session(pins, m.admit("d")))
    assert b.status is SessionStatus.EVICTED and m.num_evicted == 1
    assert code(lambda: b.submit_event(1, "add", 1)) == "evicted" and "least recently used" in b.error
    assert m.get("b") is b
    m.reclaim()  # KV pressure: the next LRU idle one (a is older than d)
    assert a.status is SessionStatus.EVICTED
    m.reclaim()
    assert m.get("d").status is SessionStatus.EVICTED
    assert m.reclaim() is False  # only the stepping one is left
    m.close("b")  # closing an evicted session is allowed
    m.close_all()
    assert pins.held == 0
