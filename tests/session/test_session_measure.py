"""The session measurement functions (reused by ``bench sessions``) run on a tiny model and
report what they say; no timing is asserted (speed is measured, not tested)."""

from __future__ import annotations

from session_helpers import check_released, make_llm

from execstate_bench.session_measure import checkpoint_vs_recompute, step_latency_under_load


def test_checkpoint_vs_recompute_reports_and_releases(moe_dir):
    llm, cold = make_llm(moe_dir), make_llm(moe_dir, enable_prefix_caching=False)
    out = checkpoint_vs_recompute(llm, cold, 100, repeats=2)
    assert out["context_tokens"] == 100
    assert all(out[k] > 0 for k in ("checkpoint_ms", "rollback_ms", "recompute_ms", "restore_speedup"))
    check_released(llm)
    check_released(cold)


def test_step_latency_under_load_reports_every_mode_and_releases(moe_dir):
    llm = make_llm(moe_dir, max_num_seqs=4)
    out = step_latency_under_load(llm, steps=3, input_len=4, max_tokens=3, batch_prompt_len=16,
                                  batch_max_tokens=12, queued=2)
    assert set(out) == {"no_load", "load_interactive", "load_batch_class", "workload"}
    assert out["no_load"]["batch_requests"] == 0 and out["load_interactive"]["batch_requests"] >= 6
    assert all(out[m]["p99_ms"] >= out[m]["p50_ms"] > 0 for m in ("no_load", "load_interactive", "load_batch_class"))
    check_released(llm)
