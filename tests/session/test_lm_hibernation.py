"""LM session hibernation (session/lm/hibernation.py): a session's blocks go to the tiers, its pool
blocks are released, and a woken session's next steps equal those of a session that never slept
(tokens and routes), after the pool was churned so its blocks come back in other slots."""

from __future__ import annotations

import pytest
from hibernation_helpers import GREEDY, SAMPLED, check_clean, churn, close, keys_of, make, prompt, same_step

from execstate.identity.tenant import tenant_id
from execstate.session.runtime.access import SESSIONS, Access, Owner
from execstate.session.runtime.events import SessionEventError


@pytest.fixture(scope="module")
def cold(moe_dir):
    """The oracle engine: no tiers, sessions that never sleep."""
    llm = make(moe_dir, num_kv_blocks=64)
    yield llm
    close(llm)


def _history(s):
    a = s.step(prompt(1, 100))
    b = s.step(prompt(2, 21))
    return [a, b]


@pytest.mark.parametrize("params", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_woken_session_equals_never_slept(params, moe_dir, cold):
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        s = llm.open_session(sampling_params=params)
        t = cold.open_session(sampling_params=params)
        for x, y in zip(_history(s), _history(t), strict=True):
            same_step(x, y)
        keys = keys_of(llm, s.token_ids)
        before = [llm.engine.block_pool.lookup(k) for k in keys]
        info = s.hibernate()
        assert info.status == "hibernated" and info.num_kv_tokens == 0
        assert llm.engine.kv_holds.num_holders == 0  # no pool block pinned by the sleeping session
        assert llm.engine.block_pool.num_used == 0
        usage = llm.sessions.usage()[tenant_id("local")]
        assert usage["hibernated"] == 1 and usage["sessions"] == 1 and usage["pinned_blocks"] == 0  # still counted
        assert usage["hibernated_bytes"] >= len(keys) * llm.engine.offload.unit_nbytes
        churn(llm, keys)
        got = s.step(prompt(3, 9))  # wakes it transparently
        want = t.step(prompt(3, 9))
        same_step(got, want)
        done = llm.engine.offload.loads.last_done
        assert done.num_verified == len(keys) and set(done.sources) == {"dram"}
        after = [llm.engine.block_pool.lookup(k) for k in keys]
        assert None not in after and after != before  # restored into other slots, routes unchanged
        assert s.token_ids == t.token_ids
        assert s.routed_experts.tobytes() == t.routed_experts.tobytes()
        same_step(s.step(prompt(4, 5)), t.step(prompt(4, 5)))
        assert s.info().status == "open"
        if params is GREEDY:  # and a one-shot generate over the whole history
            hist = s.token_ids
            cut = len(hist) - 7
            one = cold.generate({"prompt_token_ids": hist[:cut]}, GREEDY, use_tqdm=False)[0].outputs[0]
            assert one.token_ids == hist[cut:]
        check_clean(llm)
    finally:
        close(llm)
        t.close()


def test_wake_by_event_checkpoint_and_explicit(moe_dir, cold):
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        s = llm.open_session(sampling_params=SAMPLED)
        t = cold.open_session(sampling_params=SAMPLED)
        _history(s), _history(t)
        cp_s, cp_t = s.checkpoint(), t.checkpoint()
        s.hibernate()
        assert llm.engine.block_pool.num_used == 0  # the checkpoint's pins are released too
        ack = s.submit_event(event_id=5, kind="input", data={"token_ids": [7, 8, 9]})  # wakes it
        t.submit_event(event_id=5, kind="input", data={"token_ids": [7, 8, 9]})
        assert ack.status == "accepted" and s.info().status == "open"
        same_step(s.step(), t.step())
        s.hibernate()
        churn(llm, keys_of(llm, s.token_ids))
        s.rollback(cp_s)  # a rollback to a checkpoint taken before it slept
        t.rollback(cp_t)
        same_step(s.step([1, 2, 3]), t.step([1, 2, 3]))
        s.hibernate()
        assert s.wake().status == "open"
        assert s.wake().status == "open"  # idempotent
        same_step(s.step([4]), t.step([4]))
        check_clean(llm)
    finally:
        close(llm)
        t.close()


def test_without_units_recomputes(moe_dir, cold):
    """No tier at all: the woken session recomputes its context from the stored token ids."""
    llm = make(moe_dir)
    try:
        s = llm.open_session(sampling_params=SAMPLED)
        t = cold.open_session(sampling_params=SAMPLED)
        _history(s), _history(t)
        s.hibernate()
        churn(llm, keys_of(llm, s.token_ids))
        got = s.step([5, 6])
        assert got.num_computed_tokens == len(s.token_ids) - len(got.token_ids)  # everything recomputed
        same_step(got, t.step([5, 6]))
    finally:
        close(llm)
        t.close()


def test_corrupt_units_fail_closed(moe_dir, cold):
    """Every unit discarded or corrupt in DRAM: the reload verifies nothing and recomputes."""
    llm = make(moe_dir, offload_dram_bytes=64 << 20)
    try:
        s = llm.open_session(sampling_params=SAMPLED)
        t = cold.open_session(sampling_params=SAMPLED)
        _history(s), _history(t)
        s.hibernate()
        keys = keys_of(llm, s.token_ids)
        churn(llm, keys)
        host = llm.engine.offload.host
        for k in keys[::2]:  # flip a byte of every other unit's KV in its DRAM slot
            held = host.acquire(k)
            assert held is not None
            held[2][7] ^= 0xFF
            host.unpin(k)
        same_step(s.step([5, 6]), t.step([5, 6]))
        done = llm.engine.offload.loads.last_done
        assert done.num_verified == 0 and done.failures[0].kind == "checksum"
        check_clean(llm)
    finally:
        close(llm)
        t.close()


def test_another_tenant_can_neither_hibernate_nor_wake(moe_dir):
    llm = make(moe_dir, offload_dram_bytes=16 << 20)
    try:
        alice = Access(Owner(tenant_id("alice"), SESSIONS))
        bob = Access(Owner(tenant_id("bob"), SESSIONS))
        from execstate.session.lm.hibernation import hibernate, wake

        rt = llm.sessions.open("s1", access=alice)
        with pytest.raises(SessionEventError) as e:
            hibernate(llm.sessions, "s1", bob)
        assert e.value.code == "not_found"
        hibernate(llm.sessions, "s1", alice)
        for op in (lambda: wake(llm.sessions, "s1", bob), lambda: llm.sessions.info("s1", bob),
                   lambda: llm.sessions.submit_event("s1", 0, "input", {"token_ids": [1]}, bob)):
            with pytest.raises(SessionEventError) as e:
                op()
            assert e.value.code == "not_found"
        assert rt.status.value == "hibernated"  # bob's calls did not wake it
        assert wake(llm.sessions, "s1", alice).status.value == "open"
    finally:
        close(llm)


def test_stale_manifest_is_detected(moe_dir):
    """A manifest of an earlier step (validly encoded) is refused before use: FAILED, desync."""
    from execstate.session.lm import hibernation as hib

    llm = make(moe_dir, offload_dram_bytes=16 << 20)
    try:
        s = llm.open_session(sampling_params=SAMPLED)
        s.step(prompt(1, 40))
        stale = hib.hibernate(llm.sessions, s.session_id)
        old_manifest, old_digest = stale.manifest, stale.digest
        s.step([3])
        record = hib.hibernate(llm.sessions, s.session_id)
        record.manifest, record.digest = old_manifest, old_digest
        with pytest.raises(SessionEventError) as e:
            s.step([4])
        assert e.value.code == "desync" and "stale" in e.value.message
        assert s.info().status == "failed"
        s.reset()
        assert s.info().status == "open"
    finally:
        close(llm)


def test_idle_sessions_hibernate_before_they_expire(moe_dir):
    """policy.hibernate_after_s: detached idle sessions hibernate (the sweep), then expire at the TTL."""
    from execstate.session.lm.hibernation import hibernate_idle
    from execstate.session.runtime.manager import SessionPolicy

    with pytest.raises(ValueError, match="below idle_ttl_s"):
        SessionPolicy(idle_ttl_s=5.0, hibernate_after_s=5.0)
    llm = make(moe_dir, offload_dram_bytes=16 << 20)
    try:
        now = [100.0]
        manager = llm.sessions.manager
        manager.policy = SessionPolicy(idle_ttl_s=60.0, hibernate_after_s=10.0)
        manager.clock = lambda: now[0]
        idle = llm.open_session(sampling_params=SAMPLED)
        idle.step(prompt(1, 40))
        busy = llm.open_session(sampling_params=SAMPLED)
        now[0] += 9.0
        busy.step([5])  # used within the window: stays awake
        now[0] += 2.0
        assert [r.session_id for r in hibernate_idle(llm.sessions)] == [idle.session_id]
        assert idle.info().status == "hibernated" and busy.info().status == "open"
        assert hibernate_idle(llm.sessions) == []  # a hibernated one is not hibernated again
        now[0] += 60.0
        assert sorted(llm.sessions.expire_idle()) == sorted([idle.session_id, busy.session_id])
        with pytest.raises(SessionEventError) as e:
            idle.step([1])
        assert e.value.code == "expired"
    finally:
        close(llm)
