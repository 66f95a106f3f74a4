"""Live session migration between two engines in one process (docs/contracts.md 5, 6):
the migrated session's next steps equal those it would have produced in place (tokens and routes,
greedy and sampling: the RNG state travels), its identity (id, branch, step index, epochs, state
key) is kept, pending events and acknowledgements travel; an injected failure leaves the source
session intact and serving and the target holding nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from migration_helpers import (
    Engines,
    assert_holds_nothing,
    assert_same_steps,
    assert_source_released,
)
from session_helpers import GREEDY, SAMPLED, check_accounting, make_llm, tokens

from execstate.session.lm.migration import migrate_session
from execstate.session.lm.migration_wire import MigrationError
from execstate.session.runtime.events import SessionEventError
from execstate.transfer.checks import kv_layout_of

A, B, C, D = tokens(30, 37), tokens(31, 6), tokens(32, 9), tokens(33, 4)
UNSEEDED = replace(SAMPLED, seed=None)


@pytest.fixture()
def engines(moe_dir):
    built = Engines(moe_dir)
    yield built
    built.close()


@pytest.mark.parametrize("params", [GREEDY, SAMPLED, UNSEEDED], ids=["greedy", "seeded", "unseeded"])
def test_migrated_session_steps_as_it_would_in_place(engines, moe_dir, params):
    ref_llm = make_llm(moe_dir)
    ref = ref_llm.open_session(sampling_params=params)
    ref_ab = [ref.step(A), ref.step(B)]
    ref_tokens, ref_routes = ref.token_ids, ref.routed_experts
    ref_cd = [ref.step(C), ref.step(D)]
    a, b = engines(), engines()
    s = a.open_session(sampling_params=params, session_id="mig-1")
    assert_same_steps([s.step(A), s.step(B)], ref_ab)
    key, branch, epoch = s.state_key(), s.branch_id, s.event_epoch
    m = migrate_session(s, b)
    s2 = m.session
    # 59 tokens, KV for 58 at the source: 3 full blocks sent, the 10-token tail recomputed on b
    r = m.result
    assert (r.session_id, r.num_tokens, r.blocks_transferred, r.blocks_from_cache, r.blocks_recomputed,
            r.tokens_recomputed, r.load_error) == ("mig-1", 59, 3, 0, 0, 10, None)
    assert r.kv_bytes == 3 * kv_layout_of(a.engine.kv_pool).block_nbytes and m.seconds > 0
    assert s.status == "closed" and s2.status == "open"
    assert (s2.session_id, s2.step_index, s2.branch_id, s2.event_epoch) == ("mig-1", 2, branch, epoch)
    assert s2.state_key() == key  # same chain, step, epoch, branch: the same state
    assert s2.token_ids == ref_tokens and s2.routed_experts.tobytes() == ref_routes.tobytes()
    got = [s2.step(C), s2.step(D)]
    assert_same_steps(got, ref_cd)
    assert got[0].num_computed_tokens == ref_cd[0].num_computed_tokens + 10  # the tail, recomputed here
    assert s2.routed_experts.tobytes() == ref.routed_experts.tobytes()
    assert_source_released(a)
    check_accounting(b)
    s2.close()
    assert b.engine.kv_holds.num_holders == 0 and b.engine.block_pool.num_used == 0


def test_pending_events_and_acknowledgements_travel(engines, moe_dir):
    def prepare(s):
        s.step(A)
        s.submit_event(10, "input", {"token_ids": B})
        s.submit_event(11, "sampling", {"max_tokens": 3})

    ref = make_llm(moe_dir).open_session(sampling_params=GREEDY)
    prepare(ref)
    want = ref.step()
    a, b = engines(), engines()
    s = a.open_session(sampling_params=GREEDY)
    prepare(s)
    s2 = s.migrate(b)
    assert s2.submit_event(10, "input", {"token_ids": B}).duplicate  # the source's ack travelled
    with pytest.raises(SessionEventError) as e:
        s2.submit_event(9, "input", {"token_ids": B})
    assert e.value.code == "stale"
    got = s2.step()
    assert got.events == want.events == {"started": [10, 11], "active": [], "completed": [10, 11]}
    assert len(got.token_ids) == 3
    assert_same_steps([got], [want])
    s2.close()


def test_checkpoints_stay_behind_and_reset_returns_to_the_migrated_state(engines, moe_dir):
    a, b = engines(), engines()
    s = a.open_session(sampling_params=SAMPLED)
    s.step(A)
    s.checkpoint()
    s.step(B)
    s2 = s.migrate(b)
    assert_source_released(a)  # the checkpoint ended with the source session
    assert s2.checkpoints == []
    first = s2.step(C)
    s2.reset()  # no checkpoint here: back to the state it arrived in (its origin), RNG included
    assert s2.step_index == 2
    again = s2.step(C)
    assert_same_steps([again], [first])
    s2.close()
    check_accounting(b)


FAULT_CODES = {
    "corrupt": "checksum_mismatch",
    "drop": "timeout",
    "truncate": "truncated",
    "stale_transfer_id": "unknown_transfer",
    "duplicate": "released",
}


@pytest.mark.parametrize("mode", sorted(FAULT_CODES))
def test_injected_failure_leaves_the_source_serving_and_the_target_empty(engines, moe_dir, mode):
    ref = make_llm(moe_dir).open_session(sampling_params=SAMPLED)
    want = [ref.step(A), ref.step(B), ref.step(C)]
    a = engines()
    b = engines(faults={"mode": mode, "delay_s": 0.0}, timeout_s=1.0)
    s = a.open_session(sampling_params=SAMPLED, session_id="mig-fault")
    s.step(A)
    s.step(B)
    key = s.state_key()
    with pytest.raises(MigrationError) as e:
        migrate_session(s, b)
    assert e.value.code == FAULT_CODES[mode], str(e.value)
    assert s.status == "open" and s.state_key() == key
    assert_holds_nothing(b, "mig-fault")
    a.engine.poll()
    assert a.engine.pd.num_pinned_exports == 0
    check_accounting(a)
    assert_same_steps([s.step(C)], want[2:])  # serving, as if nothing had happened
    assert s.token_ids == ref.token_ids and s.routed_experts.tobytes() == ref.routed_experts.tobytes()
    s.close()


def test_recompute_policy_keeps_the_verified_prefix_and_recomputes_the_rest(engines, moe_dir):
    ref = make_llm(moe_dir).open_session(sampling_params=SAMPLED)
    want = [ref.step(A), ref.step(B), ref.step(C), ref.step(D)]
    a = engines()
    b = engines(faults={"mode": "corrupt", "corrupt_block": 1}, failure_policy="recompute")
    s = a.open_session(sampling_params=SAMPLED)
    s.step(A)
    s.step(B)
    m = migrate_session(s, b)
    r = m.result
    assert (r.blocks_transferred, r.blocks_recomputed, r.tokens_recomputed) == (1, 2, 58 - 16)
    assert r.load_error is not None and r.load_error.startswith("checksum_mismatch")
    s2 = m.session
    assert_same_steps([s2.step(C), s2.step(D)], want[2:])
    assert s2.routed_experts.tobytes() == ref.routed_experts.tobytes()
    s2.close()
    check_accounting(b)


def test_the_target_uses_its_own_cached_prefix(engines, moe_dir):
    ref = make_llm(moe_dir).open_session(sampling_params=GREEDY)
    want = [ref.step(A), ref.step(B), ref.step(C)]
    a, b = engines(), engines()
    b.generate({"prompt_token_ids": A[:33]}, GREEDY, use_tqdm=False)  # b caches blocks 0 and 1
    s = a.open_session(sampling_params=GREEDY)
    s.step(A)
    s.step(B)
    m = migrate_session(s, b)
    assert (m.result.blocks_from_cache, m.result.blocks_transferred) == (2, 1)
    assert_same_steps([m.session.step(C)], want[2:])
    m.session.close()
    check_accounting(b)


def _refusal_setup(engines, moe_dir, moe_dir_other_weights, case):
    if case == "conflict":
        b = engines()
        b.open_session(session_id="mig-r")
        return b, {}
    if case == "capacity":
        b = engines(llm_kw={"max_sessions": 1})
        b.open_session(session_id="other")
        return b, {}
    if case == "incompatible":
        return engines(path=moe_dir_other_weights), {}
    if case == "unauthorized":
        return engines(secret="another-secret-of-enough-length"), {}
    assert case == "timeout"
    return engines(), {"timeout_s": 1e-6}


@pytest.mark.parametrize("case", ["conflict", "capacity", "incompatible", "unauthorized", "timeout"])
def test_a_refusing_target_leaves_the_source_serving(engines, moe_dir, moe_dir_other_weights, case):
    a = engines()
    b, kw = _refusal_setup(engines, moe_dir, moe_dir_other_weights, case)
    before = {rt.session_id for rt in _resident(b)}
    s = a.open_session(sampling_params=GREEDY, session_id="mig-r")
    s.step(A)
    with pytest.raises(MigrationError) as e:
        migrate_session(s, b, **kw)
    assert e.value.code == case, str(e.value)
    assert {rt.session_id for rt in _resident(b)} == before
    assert b.engine.pd.num_loads_inflight == 0  # b's own sessions are empty: nothing held, nothing in use
    assert b.engine.kv_holds.num_holders == 0 and b.engine.block_pool.num_used == 0
    check_accounting(b)
    a.engine.poll()
    assert a.engine.pd.num_pinned_exports == 0
    assert s.status == "open" and len(s.step(B).token_ids) == 8
    check_accounting(a)
    s.close()


def _resident(llm):
    return llm.sessions.manager.resident()
