"""``execstate bench throughput --dtype bfloat16``: the bf16-weight engine peer joins the same run."""

from __future__ import annotations

import pytest

from execstate.kernels import cpu


@pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
def test_bf16_peer_and_ratio(tmp_path) -> None:
    from execstate.bench.throughput import format_table, run_throughput_bench
    from execstate.cli import build_parser
    from execstate.model.random_models import make_random

    assert build_parser().parse_args(["bench", "throughput", "--dtype", "bfloat16"]).dtype == "bfloat16"
    path = make_random("qwen3_moe", tmp_path / "m", seed=0)
    report = run_throughput_bench(model=str(path), repeats=1, peers=False, num_threads=1, prompt_len=16,
                                  max_new_tokens=4, num_prompts=2, batch1_prompts=1, print_table=False,
                                  dtype="bfloat16")
    peer = report["peers"]["execstate_bf16_r3_off"]
    assert peer["batch8"]["tokens"] == [2 * 4] and peer["batch1"]["tokens"] == [4]
    for key in ("batch8", "batch1"):
        assert report["ratios"]["bf16_over_fp32"][key]["r3_off"] > 0
    table = format_table(report)
    assert "execstate bf16 weights (R3 off)" in table and "engine bf16 weights / fp32: batch8" in table
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'bfloat16'"):
        run_throughput_bench(model=str(path), repeats=1, peers=False, dtype="float16")
