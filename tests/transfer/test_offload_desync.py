"""The desync harness over the offload tiers (execstate_bench/desync.py, execstate_bench/offload_desync.py):
every kind of corruption, on DRAM, disk and a real Redis, is detected before use (100 %) and answered by
recompute, never by a wrong token or route; the verification failure names the right check."""

from __future__ import annotations

import pytest

from execstate import LLM
from execstate.model.random_models import make_random
from execstate_bench.desync import KINDS, detection_table, format_detection_table, run_trials
from execstate_bench.offload_desync import TIER_KINDS, TierDesyncTarget

# which verification step must catch each kind (unit_checks.KINDS)
CAUGHT_BY = {
    "kv_other_block": "checksum",
    "routes_other_block": "routes",
    "record_other_tokens": "record",
    "other_weights": "identity",
    "truncated": ("format", "routes"),
    "other_tenant": "identity",
    "forged_unit": "signature",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("desync")
    return make_random("qwen3_moe", base / "w0", seed=0), make_random("qwen3_moe", base / "w1", seed=1)


@pytest.fixture(scope="module")
def oracle(models):
    return LLM(str(models[0]), enable_return_routed_experts=True, num_kv_blocks=64, block_size=16, seed=0)


@pytest.mark.parametrize("tier", ["dram", "disk", "redis"])
def test_every_injection_is_detected_and_recomputed(tier, models, oracle, tmp_path, request):
    url = request.getfixturevalue("redis_server").url if tier == "redis" else None
    target = TierDesyncTarget(tier, models[0], models[1], oracle, tmp_path, redis_url=url)
    try:
        assert target.kinds() == list(TIER_KINDS)
        results = run_trials([target])
    finally:
        target.close()
    assert [r.kind for r in results] == list(TIER_KINDS)
    for r in results:
        assert r.detected, r
        assert r.answered == "recompute" and not r.wrong, r
        caught = CAUGHT_BY[r.kind]
        assert r.detail.split(":")[0] in (caught if isinstance(caught, tuple) else (caught,)), r
    rows = detection_table(results)
    assert all(row.rate == 1.0 and row.wrong == 0 for row in rows)
    text = format_detection_table(rows)
    assert "kv_other_block" in text and "100%" in text


def test_harness_refuses_unknown_kinds():
    class Bad:
        name = "bad"

        def kinds(self):
            return ["made_up"]

        def trial(self, kind):
            raise AssertionError

    with pytest.raises(ValueError, match="unknown desync kind"):
        run_trials([Bad()])
    assert "stale_step" in KINDS and "stale_epoch" in KINDS  # phase 2's session kinds plug in here
