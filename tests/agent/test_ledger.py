"""Delegation ledger: transitions and the distinct errors, against a model of the rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.agent.ledger import DelegationState, LedgerError, ToolLedger


def test_states_and_error_codes():
    led = ToolLedger(max_open=2)
    a = led.open("calc", {"x": 1}, epoch=0, t=0.0, source="policy")
    b = led.open("calc", {}, epoch=0, t=0.0, source="model")
    with pytest.raises(LedgerError) as e:
        led.open("calc", {}, 0, 0.0, "policy")
    assert e.value.code == "capacity"
    assert led.resolve(a.delegation_id, "4", epoch=0, t=1.0).state is DelegationState.COMPLETED
    with pytest.raises(LedgerError) as e:
        led.resolve(a.delegation_id, "4", 0, 1.0)
    assert e.value.code == "duplicate"
    assert led.cancel(b.delegation_id) and not led.cancel(b.delegation_id)
    with pytest.raises(LedgerError) as e:
        led.resolve(b.delegation_id, "x", 0, 1.0)
    assert e.value.code == "late"
    with pytest.raises(LedgerError) as e:
        led.resolve("dlg_999", "x", 0, 1.0)
    assert e.value.code == "unknown"
    c = led.open("calc", {}, epoch=0, t=2.0, source="policy")
    assert led.resolve(c.delegation_id, "9", epoch=1, t=3.0).state is DelegationState.STALE  # an old epoch
    d = led.open("calc", {}, epoch=1, t=2.0, source="policy")
    assert led.resolve(d.delegation_id, None, 1, 3.0, error="boom").state is DelegationState.FAILED
    assert led.mark_stale(a.delegation_id).state is DelegationState.STALE
    with pytest.raises(LedgerError):
        led.mark_stale(a.delegation_id)


@given(st.lists(st.tuples(st.sampled_from(["open", "resolve", "cancel", "epoch"]), st.integers(0, 6)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_random_histories_follow_the_model(ops):
    led, model, epoch = ToolLedger(max_open=4), {}, 0
    ids = []
    for op, k in ops:
        if op == "epoch":
            epoch += 1
        elif op == "open":
            n_open = sum(1 for s, _ in model.values() if s == "open")
            if n_open >= 4:
                with pytest.raises(LedgerError, match="capacity"):
                    led.open("t", {}, epoch, 0.0, "policy")
                continue
            d = led.open("t", {}, epoch, 0.0, "policy")
            ids.append(d.delegation_id)
            model[d.delegation_id] = ("open", epoch)
        else:
            did = ids[k] if k < len(ids) else f"dlg_unknown_{k}"
            state, e0 = model.get(did, ("unknown", None))
            if op == "cancel":
                if state == "unknown":
                    with pytest.raises(LedgerError, match="unknown"):
                        led.cancel(did)
                else:
                    assert led.cancel(did) == (state == "open")
                    if state == "open":
                        model[did] = ("cancelled", e0)
                continue
            expect = {"unknown": "unknown", "cancelled": "late", "completed": "duplicate", "stale": "duplicate"}
            if state in expect:
                with pytest.raises(LedgerError) as exc:
                    led.resolve(did, "r", epoch, 1.0)
                assert exc.value.code == expect[state]
            else:
                got = led.resolve(did, "r", epoch, 1.0).state
                model[did] = ("completed" if e0 == epoch else "stale", e0)
                assert got.value == model[did][0]
    assert sorted(led.open_ids()) == sorted(k for k, (s, _) in model.items() if s == "open")
