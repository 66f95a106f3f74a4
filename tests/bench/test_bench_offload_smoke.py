"""``execstate bench offload`` end to end on a tiny model (the real run uses the standard model):
every part runs, replies and first tokens equal the no-tier engine's, the plot is written."""

from __future__ import annotations

from execstate.model.random_models import make_random
from execstate_bench.offload import format_offload_table, run_offload_bench


def test_bench_offload_smoke(tmp_path, redis_server):
    model = make_random("qwen3_moe", tmp_path / "m", seed=0)
    png = tmp_path / "offload.png"
    report = run_offload_bench(model=str(model), parts=("chat", "reload"), redis_url=redis_server.url,
                               lengths=(64, 128), repeats=1, tenants=2, conversations=1, turns=2, system_len=16,
                               context_len=32, user_len=16, reply_len=4, png=str(png))
    assert report["ok"]
    chat = report["chat"]
    assert list(chat["configs"]) == ["none", "dram", "dram+disk", "dram+disk+redis"]
    assert chat["reply_mismatches"] == 0 and chat["workload"]["requests"] == 4
    assert chat["configs"]["none"]["tokens_from_tiers"] == 0
    rel = report["reload"]
    assert rel["first_token_mismatches"] == 0
    assert set(rel["rows"]["128"]) >= {"recompute_ttft_s", "dram", "disk", "disk-cold", "redis"}
    assert rel["rows"]["128"]["redis"]["reload_gb_s"] > 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    text = format_offload_table(report)
    assert "dram+disk+redis" in text and "recompute" in text and "ok: True" in text
