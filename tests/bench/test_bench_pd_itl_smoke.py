"""Smoke test of ``execstate bench pd --itl-under-loads`` on a tiny random Qwen3-MoE: a prefill and
a decode subprocess, a stream on D while PD loads happen (speed is not asserted, only the report)."""

from __future__ import annotations

import json

from test_bench_pd_smoke import _execstate_children


def test_itl_under_loads_report(tmp_path):
    from execstate.model.random_models import make_random
    from execstate_bench.pd_itl import format_itl_table, run_itl_under_loads

    path = make_random("qwen3_moe", tmp_path / "m", seed=0)
    r = run_itl_under_loads(str(path), prompt_len=64, num_loads=2, quiet_tokens=6, threads=1)
    json.dumps(r)
    assert r["loads_transferred"] == 2 and r["loads_transfer_s"] > 0 and len(r["load_windows_s"]) == 2
    assert r["phases"]["without_loads"]["n"] >= 3 * 5  # three quiet windows of 6 tokens
    assert r["phases"]["during_loads"]["n"] >= 2 and r["p99_during_loads_over_without"] > 0
    assert "p99 during loads / p99 without" in format_itl_table(r)
    assert _execstate_children() == []
