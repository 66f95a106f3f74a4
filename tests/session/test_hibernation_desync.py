"""The desync harness over hibernated sessions (benchmarks/execstate_bench/hibernation_desync.py): every injection (a
stale step index, a stale event epoch, a truncated manifest, units of another tenant's salt, KV
of another block) is detected before use, 100%, and never answered with a wrong token or route."""

from __future__ import annotations

import pytest

from execstate.session.lm.llm import LLM
from execstate_bench.desync import detection_table, run_trials
from execstate_bench.hibernation_desync import HibernationDesyncTarget


@pytest.fixture(scope="module")
def target(moe_dir):
    oracle = LLM(str(moe_dir), enable_return_routed_experts=True, num_kv_blocks=64, block_size=16, seed=0)
    t = HibernationDesyncTarget(moe_dir, oracle)
    yield t
    t.close()
    oracle.sessions.close_all()


def test_every_hibernation_desync_is_detected(target):
    results = run_trials([target])
    rows = {r.kind: r for r in detection_table(results)}
    assert set(rows) == {"stale_step", "stale_epoch", "truncated_manifest", "other_tenant", "kv_other_block"}
    for r in rows.values():
        assert (r.injected, r.detected, r.wrong) == (1, 1, 0), (r, [x for x in results if x.kind == r.kind])
    by_kind = {r.kind: r for r in results}
    assert by_kind["kv_other_block"].answered == "recompute"
    assert by_kind["stale_step"].answered == "error" and by_kind["stale_step"].detail.startswith("desync")
    assert by_kind["stale_epoch"].detail.startswith("desync") and "state key" in by_kind["stale_epoch"].detail
    assert by_kind["other_tenant"].detail.startswith("desync") and "unit keys" in by_kind["other_tenant"].detail
    assert by_kind["truncated_manifest"].detail.startswith("invalid")
