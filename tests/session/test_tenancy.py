"""The session manager's ownership rules without a model (session/runtime/manager.py, access.py):
ids resolve in the caller's owner's namespace, holds refuse other kinds of callers, detached idle
sessions expire, checkpoints per session are bounded, quotas are counted from the sessions."""

from __future__ import annotations

import pytest

from execstate.identity.tenant import TenantId
from execstate.session.runtime.access import AGENTS, SESSIONS, Access, Owner
from execstate.session.runtime.events import EventKind, EventQueue, Merge, SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime
from execstate.session.runtime.manager import SessionManager, SessionPolicy
from execstate.state.quotas import Quotas

A = Access(Owner(TenantId("a"), SESSIONS))
B = Access(Owner(TenantId("b"), SESSIONS))
A_LIVE = Access(Owner(TenantId("a"), SESSIONS), "realtime")
A_AGENT = Access(Owner(TenantId("a"), AGENTS), "agent")


class State:
    """A kind state with nothing in it (the runtime's bookkeeping only)."""

    released = False

    def save(self) -> State:
        return State()

    def restore(self, saved: object) -> None: ...

    def clone(self, saved: object | None) -> State:
        return State()

    def release(self) -> None:
        self.released = True

    def chain(self):  # noqa: ANN201
        return b"\0" * 32, []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def open_(m: SessionManager, sid: str | None, access: Access) -> SessionRuntime:
    sid = m.admit(sid, access)
    return m.add(
        SessionRuntime(
            sid,
            State(),
            EventQueue({"input": EventKind("input", Merge.APPEND, lambda d: d)}),
            "br",
            owner=access.owner,
            holder=access.holder,
        )
    )


def code(fn) -> str:  # noqa: ANN001
    with pytest.raises(SessionEventError) as e:
        fn()
    return e.value.code


def test_ids_resolve_in_the_callers_namespace():
    m = SessionManager(8)
    a = open_(m, "demo", A)
    b = open_(m, "demo", B)  # the same id, another tenant: another session
    assert a is not b and m.get("demo", A) is a and m.get("demo", B) is b
    assert code(lambda: m.get("demo", A_AGENT)) == "not_found"  # another realm of the same tenant
    m.close("demo", A)
    assert m.get("demo", B).status.value == "open"  # untouched
    assert code(lambda: m.get("only-a", B)) == "not_found"
    open_(m, "only-a", A)
    assert code(lambda: m.get("only-a", B)) == "not_found"  # exists, but not for b: the same answer
    assert code(lambda: open_(m, "only-a", A)) == "invalid"


def test_a_held_session_refuses_other_kinds_of_callers():
    m = SessionManager(8)
    rt = open_(m, "live", A_LIVE)
    assert rt.holder == "realtime" and m.get("live", A_LIVE) is rt
    for call in (lambda: m.get("live", A), lambda: m.close("live", A)):
        assert code(call) == "session_in_use"
    http = open_(m, "http", A)
    m.hold("http", A_LIVE)  # session.resume of an HTTP session: held from now on
    assert http.holder == "realtime"
    assert code(lambda: m.get("http", A)) == "session_in_use"
    assert m.close("live", A_LIVE) and m.get("live", A).status.value == "closed"  # ended: no holder


def test_detached_idle_sessions_expire_held_and_busy_ones_do_not():
    clock = Clock()
    m = SessionManager(4, policy=SessionPolicy(idle_ttl_s=10.0), clock=clock)
    idle, held = open_(m, "idle", A), open_(m, "held", A_LIVE)
    open_(m, "used", A)
    stepping = open_(m, "stepping", B)
    stepping.begin_step(lambda drained: None)
    clock.now = 8.0
    m.get("used", A)  # any call resolving it counts as use
    clock.now = 12.0
    assert [rt.session_id for rt in m.expire_idle()] == ["idle"]
    assert idle.status.value == "expired" and idle.state.released
    assert code(lambda: m.get("idle", A).checkpoint()) == "expired"
    open_(m, "new", B)  # its place is free
    clock.now = 30.0
    assert {rt.session_id for rt in m.expire_idle()} == {"used", "new"}
    assert (held.status.value, stepping.status.value) == ("open", "stepping")
    assert m.num_expired == 3


def test_checkpoints_per_session_are_bounded():
    m = SessionManager(2, policy=SessionPolicy(max_checkpoints=2))
    rt = open_(m, "s", A)
    cps = [rt.checkpoint(), rt.checkpoint()]
    assert code(rt.checkpoint) == "checkpoint_limit" and rt.num_checkpoints == 2
    cps[0].release()  # released directly: its place is free again
    rt.checkpoint()
    rt.release_checkpoint(cps[1].checkpoint_id)
    rt.checkpoint()
    assert rt.num_checkpoints == 2


def test_quotas_per_tenant_and_realm():
    m = SessionManager(8, policy=SessionPolicy(quotas=Quotas(sessions=1, agents=1)))
    open_(m, "a1", A)
    assert code(lambda: open_(m, "a2", A)) == "quota"
    open_(m, "b1", B)  # another tenant's quota
    open_(m, "front", A_AGENT)  # another realm: its own quota
    assert code(lambda: open_(m, "front-2", A_AGENT)) == "quota"
    usage = m.usage()
    assert usage[TenantId("a")] == {"sessions": 1, "agents": 1, "world_sessions": 0, "checkpoints": 0, "hibernated": 0}
    assert usage[TenantId("b")]["sessions"] == 1
    m.close("a1", A)
    open_(m, "a2", A)


def test_lru_eviction_takes_the_admitting_tenants_own_session_first():
    m = SessionManager(2, eviction="lru")
    old_b, a = open_(m, "b-old", B), open_(m, "a-new", A)
    open_(m, "a-next", A)
    assert (a.status.value, old_b.status.value) == ("evicted", "open")


def test_a_policy_is_validated():
    for bad in ({"max_checkpoints": 0}, {"idle_ttl_s": 0}, {"idle_ttl_s": float("inf")}):
        with pytest.raises(ValueError):
            SessionPolicy(**bad)
    with pytest.raises(ValueError):
        Owner(TenantId("a"), "nowhere")
