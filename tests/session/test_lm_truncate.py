"""Truncation of LM sessions (``Session.truncate``: back to a checkpoint, keeping the context's next
tokens with their KV): the truncated session continues exactly as a twin that never held the
dropped tokens (token ids, logprobs, routes and the KV itself, bit for bit), none of the kept
tokens is computed again, a prefix-cached block it cuts into is copied before it is written, and
bad truncations are refused with nothing changed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from session_helpers import GREEDY, check_accounting, check_released, make_llm, tokens

from execstate.session.runtime.events import SessionEventError

A, B, C, D = tokens(30, 37), tokens(31, 9), tokens(32, 6), tokens(33, 11)
SCORED = replace(GREEDY, logprobs=5)


def kv_of(llm, s, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V the session holds for its first ``n`` context tokens."""
    pool, held = llm.engine.kv_pool, s._rt.state.blocks
    k = torch.cat([pool.k[:, pool.block_slots(b)] for b in held.block_ids], dim=1)
    v = torch.cat([pool.v[:, pool.block_slots(b)] for b in held.block_ids], dim=1)
    return k[:, :n].clone(), v[:, :n].clone()


def logprob_table(r) -> list[dict[int, float]]:
    return [{t: lp.logprob for t, lp in pos.items()} for pos in r.logprobs]


@pytest.mark.parametrize("keep", [0, 5, 9, 13], ids=["at-checkpoint", "inside-input", "whole-input", "into-output"])
def test_truncated_session_continues_as_a_twin_that_never_held_the_rest(moe_dir, keep):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=SCORED)
    s.step(A, max_tokens=8)  # 45 tokens
    cp = s.checkpoint()
    spec = s.step(B + D, max_tokens=6)  # 45 + 20 + 6: the speculative part
    assert len(s.token_ids) == 71
    n = 45 + keep
    kept = s.token_ids[45:n]
    assert kept == (B + D + list(spec.token_ids))[:keep]
    s.truncate(cp, n)
    assert s.token_ids == A + s.token_ids[37:45] + kept and s.step_index == 1
    assert s.info().num_kv_tokens == max(n - 1, 44)  # all but the last kept token (a step computes one)
    r = s.step(C, max_tokens=8)
    assert r.num_computed_tokens == len(C) + 1  # the last kept (or held) token and C: nothing kept is computed again

    twin_llm = make_llm(moe_dir)  # its own engine: no prefix cache shared with the speculation
    t = twin_llm.open_session(sampling_params=SCORED)
    t.step(A, max_tokens=8)
    rt = t.step(kept + C, max_tokens=8)
    assert r.token_ids == rt.token_ids
    assert logprob_table(r) == logprob_table(rt)  # bit for bit
    assert s.token_ids == t.token_ids
    assert s.routed_experts.tobytes() == t.routed_experts.tobytes()
    n_ctx = len(s.token_ids) - 1
    ks, vs = kv_of(llm, s, n_ctx)
    kt, vt = kv_of(twin_llm, t, n_ctx)
    assert torch.equal(ks, kt) and torch.equal(vs, vt)
    check_accounting(llm)
    s.close()
    t.close()
    check_released(llm)
    check_released(twin_llm)


def test_truncation_inside_a_cached_block_copies_it_before_writing(moe_dir):
    llm = make_llm(moe_dir)
    eng = llm.engine
    bs = eng.block_size
    s = llm.open_session(sampling_params=GREEDY)
    s.step(A[:20], max_tokens=1)  # 21 tokens, KV for 20
    cp = s.checkpoint()
    s.step(A[20:] + B, max_tokens=1)  # KV for 20 + 17 + 9 = 46: blocks 0, 1 full and committed
    held, ctx = s._rt.state.blocks, s.token_ids
    assert held.num_committed_blocks >= 2
    block1 = held.block_ids[1]
    k1 = eng.kv_pool.k[:, eng.kv_pool.block_slots(block1)].clone()
    copies_before = eng.kv_manager.num_block_copies
    s.truncate(cp, 2 * bs - 4 + 1)  # KV kept for 27 tokens: block 1 cut at 11 of 16
    r = s.step(C, max_tokens=4)
    assert eng.kv_manager.num_block_copies == copies_before + 1
    assert s._rt.state.blocks.block_ids[1] != block1
    assert torch.equal(eng.kv_pool.k[:, eng.kv_pool.block_slots(block1)], k1)  # the cached block is unchanged
    # another session over the context as it was finds both blocks in the prefix cache (block 1
    # as it was computed) and continues as a cold engine would
    o = llm.open_session(sampling_params=GREEDY)
    ro = o.step(ctx[:40], max_tokens=6)
    assert ro.num_cached_tokens == 2 * bs
    cold = make_llm(moe_dir).open_session(sampling_params=GREEDY)
    assert ro.token_ids == cold.step(ctx[:40], max_tokens=6).token_ids
    twin = make_llm(moe_dir).open_session(sampling_params=GREEDY)
    twin.step(A[:20], max_tokens=1)
    assert r.token_ids == twin.step((A[20:] + B)[: 2 * bs - 4 + 1 - 21] + C, max_tokens=4).token_ids
    check_accounting(llm)
    s.close()
    o.close()
    check_released(llm)


def test_bad_truncations_are_refused_with_nothing_changed(moe_dir):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY)
    s.step(A, max_tokens=8)
    cp1 = s.checkpoint()
    s.step(B, max_tokens=4)
    cp2 = s.checkpoint()
    s.step(C, max_tokens=4)
    before, kv_before, step = s.token_ids, s.info().num_kv_tokens, s.step_index
    for cp, n in ((cp1, 44), (cp1, len(before) + 1), (cp2, 30), (cp1, True), (cp1, "50")):
        with pytest.raises(SessionEventError) as e:
            s.truncate(cp, n)
        assert e.value.code == "invalid"
        assert (s.token_ids, s.info().num_kv_tokens, s.step_index) == (before, kv_before, step)
    s.rollback(cp1)
    s.step(D, max_tokens=4)  # another branch: cp2's tokens are no longer a prefix of the context
    with pytest.raises(SessionEventError, match="not on this context's branch") as e:
        s.truncate(cp2, 60)
    assert e.value.code == "invalid"
    s.release_checkpoint(cp2)
    with pytest.raises(SessionEventError):
        s.truncate(cp2, 50)
    check_accounting(llm)
    s.close()
    check_released(llm)
