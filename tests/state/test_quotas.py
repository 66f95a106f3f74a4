from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execstate.identity.tenant import TenantId
from execstate.state.quotas import KINDS, QuotaExceeded, QuotaLedger, Quotas

A, B = TenantId("a"), TenantId("b")


def test_reserve_release_and_refusal_changes_nothing() -> None:
    q = QuotaLedger(Quotas(sessions=2, checkpoints=3), per_tenant={B: Quotas(sessions=1)})
    q.reserve(A, "sessions")
    q.reserve(A, "sessions")
    with pytest.raises(QuotaExceeded) as e:
        q.reserve(A, "sessions")
    assert e.value.kind == "sessions" and e.value.limit == 2 and "tenant 'a'" in e.value.message
    assert q.held(A, "sessions") == 2
    q.reserve(B, "sessions")
    with pytest.raises(QuotaExceeded):
        q.reserve(B, "sessions")  # B's own limit
    q.reserve(A, "pinned_blocks", 10_000)  # unlimited
    assert q.usage() == {A: {"sessions": 2, "checkpoints": 0, "pinned_blocks": 10_000, "agents": 0,
                             "world_sessions": 0}, B: dict.fromkeys(KINDS, 0) | {"sessions": 1}}
    q.release(A, "sessions", 2)
    with pytest.raises(ValueError, match="release"):
        q.release(A, "sessions")  # a double release is a bug, not a quota refund
    q.release(A, "pinned_blocks", 10_000)
    assert A not in q.usage()
    q.check_integrity()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="quota sessions"):
        Quotas(sessions=-1)
    q = QuotaLedger()
    with pytest.raises(ValueError, match="unknown quota kind"):
        q.reserve(A, "gpus")
    with pytest.raises(ValueError):
        q.reserve(A, "sessions", -1)


@given(st.lists(st.tuples(st.sampled_from([A, B]), st.sampled_from(KINDS), st.booleans(), st.integers(0, 3))))
def test_counts_match_a_model(ops: list[tuple[TenantId, str, bool, int]]) -> None:
    q = QuotaLedger(Quotas(sessions=3, checkpoints=4, pinned_blocks=5, agents=1, world_sessions=2))
    model: dict[tuple[TenantId, str], int] = {}
    for tenant, kind, take, n in ops:
        held = model.get((tenant, kind), 0)
        if take:
            try:
                q.reserve(tenant, kind, n)
                model[(tenant, kind)] = held + n
            except QuotaExceeded:
                assert held + n > q.quotas.limit(kind)
        elif n <= held:
            q.release(tenant, kind, n)
            model[(tenant, kind)] = held - n
        q.check_integrity()
    for (tenant, kind), n in model.items():
        assert q.held(tenant, kind) == n
