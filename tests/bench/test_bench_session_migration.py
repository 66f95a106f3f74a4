"""Smoke test of the session migration measurement on a tiny random Qwen3-MoE: every phase is
timed, the migrated session's next token equals a one-shot generate over its history, and each
injected fault is detected and recovered from at the source."""

from __future__ import annotations

import json

from execstate.model.random_models import make_random
from execstate_bench.session_migration import measure_migration


def test_measure_migration_smoke(tmp_path):
    path = make_random("qwen3_moe", tmp_path / "m", seed=0)
    out = measure_migration(path, context_len=70, repeats=2, recompute_repeats=1,
                            fault_modes=("corrupt", "drop"), fault_timeout_s=0.5, failure_repeats=1)
    json.dumps(out)
    assert out["tokens_equal"] is True
    assert (out["blocks_transferred"], out["tokens_recomputed"]) == (4, 69 - 64)
    assert out["kv_bytes"] > 0 and out["offer_bytes"] > 0
    for key in ("export_s", "import_s", "finish_s", "first_step_s", "recompute_s"):
        assert out[key] > 0
    assert out["migrate_s"] >= out["import_s"]
    assert out["state_recovery_overhead"] == out["migrate_s"] / out["recompute_s"]
    fail = out["failure_recovery"]
    assert fail["corrupt"]["error"] == "checksum_mismatch" and fail["drop"]["error"] == "timeout"
    assert fail["drop"]["detect_s"] >= 0.5  # bounded by the connector's timeout
    for f in fail.values():
        assert f["recovery_s"] > f["detect_s"] > 0
