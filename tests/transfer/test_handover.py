"""The receiving side of a two-phase hand-over: single-use nonces, commit/abort, expiry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.transfer.handover import HandoverError, HandoverLedger, HandoverState

N1, N2 = "n" * 32, "m" * 32


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_happy_path_and_replay() -> None:
    c = Clock()
    h = HandoverLedger(clock=c)
    h.admit(N1, c.t + 60)
    assert h.state(N1) is HandoverState.IMPORTING
    h.imported(N1)
    h.commit(N1)
    h.commit(N1)  # a retried commit is idempotent
    assert h.state(N1) is HandoverState.COMMITTED
    with pytest.raises(HandoverError) as e:
        h.admit(N1, c.t + 60)
    assert e.value.code == "replay"
    with pytest.raises(HandoverError) as e:
        h.abort(N1)
    assert e.value.code == "committed"  # the receiver serves it: the sender must not resume


def test_abort_then_commit_is_refused_and_a_late_offer_too() -> None:
    c = Clock()
    h = HandoverLedger(clock=c)
    h.admit(N1, c.t + 60)
    h.imported(N1)
    assert h.abort(N1) is True
    with pytest.raises(HandoverError) as e:
        h.commit(N1)
    assert e.value.code == "aborted"
    # an abort that arrives before its offer (the offer was delayed): the offer is then refused
    assert h.abort(N2, expires_at=c.t + 60) is False
    with pytest.raises(HandoverError) as e:
        h.admit(N2, c.t + 60)
    assert e.value.code == "replay"


def test_expiry_aborts_pending_imports_and_refuses_expired_offers() -> None:
    c = Clock()
    h = HandoverLedger(clock=c, remember_s=30)
    h.admit(N1, c.t + 10)
    h.imported(N1)
    c.t += 11
    with pytest.raises(HandoverError) as e:
        h.commit(N1)
    assert e.value.code == "aborted"
    c.t = 2000
    assert h.expire() == [] and len(h) == 0  # forgotten after expiry + remember_s
    with pytest.raises(HandoverError) as e:
        h.admit(N1, 1010)  # the same offer again: expired, so still refused
    assert e.value.code == "expired"


def test_admit_returns_imports_that_expired_and_bounds_entries() -> None:
    c = Clock()
    h = HandoverLedger(max_entries=2, clock=c, remember_s=0)
    h.admit(N1, c.t + 5)
    h.admit(N2, c.t + 100)
    with pytest.raises(HandoverError) as e:
        h.admit("k" * 32, c.t + 100)
    assert e.value.code == "capacity"
    c.t += 6
    assert h.admit("k" * 32, c.t + 100) == [N1]  # N1's import expired: its state must be dropped
    with pytest.raises(HandoverError) as e:
        h.admit("short", c.t + 100)
    assert e.value.code == "invalid"


OPS = st.lists(st.tuples(st.sampled_from(["admit", "imported", "commit", "abort", "tick"]),
                         st.sampled_from([N1, N2])), max_size=40)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_an_offer_is_used_once_and_a_commit_is_never_undone(ops: list[tuple[str, str]]) -> None:
    """Each nonce stands for one signed offer with a fixed expiry: replaying it, however late, never
    admits it twice; a committed hand-over never becomes aborted."""
    c = Clock()
    h = HandoverLedger(clock=c, remember_s=5)
    expiry: dict[str, float] = {}
    admitted: dict[str, int] = {}
    committed: set[str] = set()
    for op, n in ops:
        exp = expiry.setdefault(n, c.t + 20)
        try:
            if op == "admit":
                h.admit(n, exp)
                admitted[n] = admitted.get(n, 0) + 1
            elif op == "imported":
                h.imported(n)
            elif op == "commit":
                h.commit(n)
                committed.add(n)
            elif op == "abort":
                h.abort(n, expires_at=exp)
            else:
                c.t += 7
                h.expire()
        except HandoverError:
            pass
        h.check_integrity()
        for m in committed:
            assert h.state(m) in (HandoverState.COMMITTED, None)
    assert all(v == 1 for v in admitted.values())


def test_a_late_abort_of_a_forgotten_commit_records_nothing() -> None:
    """Hypothesis found it: committed, forgotten after expiry + remember_s, then an abort of the same
    nonce was recorded as ABORTED, so a commit read as undone."""
    c = Clock()
    h = HandoverLedger(clock=c, remember_s=5)
    n = "n" * 16
    h.admit(n, c.t + 20)
    h.imported(n)
    h.commit(n)
    c.t += 28  # past expiry (20) + remember_s (5): forgotten
    assert h.abort(n, expires_at=20) is False
    assert h.state(n) is None and len(h) == 0
    with pytest.raises(HandoverError, match="expired"):
        h.admit(n, 20)  # the late offer is still refused
