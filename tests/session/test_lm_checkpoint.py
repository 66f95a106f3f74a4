"""Checkpoint, rollback and fork of LM sessions: a checkpoint pins the block chain
without copying KV (copy-on-write of the shared partial tail, one block), rollback reproduces the
same tokens and routes also when sampling, a fork equals a fresh session fed the same history and
the branches do not affect each other; blocks are freed exactly once."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from session_helpers import GREEDY, SAMPLED, check_accounting, check_released, generate, make_llm, tokens

from execstate.session.runtime.events import SessionEventError

A, B, C, D, E = tokens(20, 37), tokens(21, 6), tokens(22, 9), tokens(23, 4), tokens(24, 5)
UNSEEDED = replace(SAMPLED, seed=None)


def held(s):
    return s._rt.state.blocks


def test_checkpoint_shares_blocks_and_copies_only_the_shared_tail_on_write(moe_dir, monkeypatch):
    llm = make_llm(moe_dir)
    eng, pool = llm.engine, llm.engine.block_pool
    s = llm.open_session(sampling_params=GREEDY)
    s.step(A, max_tokens=8)  # 45 tokens, KV for 44: blocks of 16, 16, 12 (partial)
    ids = list(held(s).block_ids)
    assert len(ids) == 3 and held(s).num_tokens == 44
    cp = s.checkpoint()
    assert cp.saved.blocks.block_ids == ids and cp.saved.blocks is not held(s)  # same blocks, no copy
    assert [pool.ref_count(b) for b in ids] == [2, 2, 2]
    check_accounting(llm)
    copies = []
    real = eng.kv_pool.copy_blocks
    monkeypatch.setattr(eng.kv_pool, "copy_blocks", lambda pairs: (copies.extend(pairs), real(pairs)))
    tail = eng.kv_pool.block_slots(ids[2])
    k_tail, v_tail = eng.kv_pool.k[:, tail].clone(), eng.kv_pool.v[:, tail].clone()
    s.step(B, max_tokens=4)
    assert len(copies) == 1 and copies[0][0] == ids[2]  # exactly one block copied: the shared tail
    new_tail = copies[0][1]
    now = held(s).block_ids
    assert now[:2] == ids[:2] and now[2] == new_tail != ids[2]
    assert torch.equal(eng.kv_pool.k[:, tail], k_tail) and torch.equal(eng.kv_pool.v[:, tail], v_tail)  # unchanged
    copied = eng.kv_pool.block_slots(new_tail)
    assert torch.equal(eng.kv_pool.k[:, copied][:, :12], k_tail[:, :12])  # the 12 tokens it held, then new ones
    assert [pool.ref_count(b) for b in ids] == [2, 2, 1] and pool.ref_count(new_tail) == 1
    s.step(C, max_tokens=4)
    assert len(copies) == 1  # the session's own tail is no longer shared: written in place
    check_accounting(llm)
    s.close()
    check_released(llm)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED, UNSEEDED], ids=["greedy", "seeded", "unseeded"])
def test_rollback_reproduces_tokens_and_routes(moe_dir, params):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=params)
    s.step(A, max_tokens=8)
    cp = s.checkpoint()
    r2, r3 = s.step(B), s.step(C)
    tokens_after, routes_after = s.token_ids, s.routed_experts
    s.rollback(cp)
    assert s.step_index == 1 and s.token_ids == A + s.token_ids[37:45] and len(s.token_ids) == 45
    r2b, r3b = s.step(B), s.step(C)
    assert (r2b.token_ids, r3b.token_ids) == (r2.token_ids, r3.token_ids)
    assert r2b.routed_experts.tobytes() == r2.routed_experts.tobytes()
    assert r3b.routed_experts.tobytes() == r3.routed_experts.tobytes()
    assert s.token_ids == tokens_after and s.routed_experts.tobytes() == routes_after.tobytes()
    if params is not GREEDY:  # it really sampled: the greedy continuation differs
        greedy = generate(make_llm(moe_dir), A + s.token_ids[37:45] + B, max_tokens=8)
        assert greedy.token_ids != r2.token_ids
    check_accounting(llm)
    s.close()
    check_released(llm)


def test_rollback_restores_pending_events_and_reset_leaves_failed(moe_dir):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=SAMPLED)
    s.step(A)
    s.submit_event(10, "input", {"token_ids": D})
    cp = s.checkpoint()
    r = s.step(max_tokens=5)
    epoch = s.event_epoch
    s.rollback(cp)
    assert s.info().num_pending_events == 1 and s.event_epoch > epoch
    assert s.step(max_tokens=5).token_ids == r.token_ids
    s.close()
    with pytest.raises(SessionEventError) as ei:
        s.rollback(cp)
    assert ei.value.code == "closed"
    check_released(llm)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_fork_equals_a_fresh_session_and_the_branches_are_independent(moe_dir, params):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=params)
    s.step(A)
    s.step(B)
    cp = s.checkpoint()
    f = s.fork(cp)
    assert f.session_id != s.session_id and f.branch_id != s.branch_id and f.step_index == 2
    assert held(f).block_ids == held(s).block_ids  # shared prefix blocks (and tail), pinned once more each
    # held by the session, its checkpoint, the fork and the fork's origin (what its reset returns to)
    assert all(llm.engine.block_pool.ref_count(b) == 4 for b in held(s).block_ids)
    rs_c, rs_d = s.step(C), s.step(D)  # the parent goes one way
    rf_c, rf_e = f.step(C), f.step(E)  # the fork another
    assert rf_c.token_ids == rs_c.token_ids  # same state, same RNG state: same step
    fresh = llm.open_session(sampling_params=params)
    for x in (A, B, C):
        fresh.step(x)
    assert fresh.step(E).token_ids == rf_e.token_ids and fresh.token_ids == f.token_ids
    assert fresh.routed_experts.tobytes() == f.routed_experts.tobytes()
    again = llm.open_session(sampling_params=params)
    for x in (A, B, C):
        again.step(x)
    assert again.step(D).token_ids == rs_d.token_ids and again.token_ids == s.token_ids
    f_now = f.fork()  # fork(None): at the current step
    assert f_now.token_ids == f.token_ids and f_now.step(E).token_ids == f.step(E).token_ids
    check_accounting(llm)
    for x in (s, f, fresh, again, f_now):
        x.close()
    check_released(llm)


def test_blocks_are_freed_exactly_once_whatever_closes_first(moe_dir):
    llm = make_llm(moe_dir)
    pool = llm.engine.block_pool
    s = llm.open_session(sampling_params=GREEDY)
    s.step(A)
    cp1 = s.checkpoint()
    s.step(B)
    f = s.fork(cp1)
    cp2 = s.checkpoint()
    s.close()  # releases its state, cp1 and cp2; the fork keeps its own references
    assert pool.num_used == len(held(f).block_ids) and cp1.released and cp2.released
    assert all(pool.ref_count(b) == 2 for b in held(f).block_ids)  # the fork and its origin
    cp2.release()  # releasing again is a no-op
    assert f.step(C).token_ids == generate(make_llm(moe_dir), A + f.token_ids[37:45] + C).token_ids
    check_accounting(llm)
    f.close()
    f.close()
    check_released(llm)


def test_checkpoints_are_per_session_and_released_on_request(moe_dir):
    llm = make_llm(moe_dir)
    s, t = llm.open_session(sampling_params=GREEDY), llm.open_session(sampling_params=GREEDY)
    s.step(A)
    t.step(B)
    cp = s.checkpoint()
    with pytest.raises(SessionEventError) as ei:
        t.rollback(cp)
    assert ei.value.code == "invalid"
    with pytest.raises(SessionEventError) as ei:
        t.rollback("cp-9")
    assert ei.value.code == "not_found"
    assert [c.checkpoint_id for c in s.checkpoints] == ["cp-1"]
    s.release_checkpoint("cp-1")
    assert s.checkpoints == [] and llm.engine.kv_holds.num_holders == 2  # the two sessions' own blocks
    s.close()
    t.close()
    check_released(llm)


def test_printing_a_checkpoint_is_one_short_line(moe_dir):
    """``print(cp)`` does not dump the route array or the KV holds."""
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    s.step(A, max_tokens=8)
    cp = s.checkpoint()
    text = repr(cp)
    assert text == (f"Checkpoint({cp.checkpoint_id!r}, session={s.session_id!r}, step=1, epoch={cp.event_epoch}, "
                    f"branch={cp.branch_id!r}, 0 pending event(s), pinned)")
    assert str(cp) == text and "\n" not in text and len(text) < 200
    s.close()
    assert repr(cp).endswith("released)")
