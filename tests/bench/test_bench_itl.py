"""Smoke test of ``execstate bench itl`` on a short run: the report's shape, the timing
split adding up, and the CLI table. (The numbers themselves are measured, not asserted.)"""

from __future__ import annotations

import json

from execstate.cli import build_parser
from execstate_bench.itl import StepTimes, format_itl_table, run_itl_bench


def test_report_and_table():
    report = run_itl_bench(max_tokens=220, kinds=("delta", "final_only"), window=20, repeats=2)
    json.dumps(report)
    assert report["workload"]["max_tokens"] == 220 and report["workload"]["repeats"] == 2
    assert set(report["output_path"]) == set(report["end_to_end"]) == {"delta", "final_only"}
    for r in report["end_to_end"].values():
        assert r["early"]["tokens"] == "91-110" and r["late"]["tokens"] == "201-220"
        for w in (r["early"], r["late"]):
            assert 0 < w["output_ms"] < w["host_ms"] and w["forward_ms"] > 0
    table = format_itl_table(report)
    assert "at 220" in table and "late/early" in table and "final_only" in table


def test_window_split():
    t = StepTimes(itl=[3.0] * 10, step=[2.0] * 10, forward=[1.5] * 10, output=[0.25] * 10)
    w = t.window(center=9, width=4)  # clipped to the last 4 tokens
    assert w == {"tokens": "7-10", "itl_ms": 3000.0, "forward_ms": 1500.0, "host_ms": 500.0, "output_ms": 250.0}


def test_cli_arguments():
    args = build_parser().parse_args(["bench", "itl", "--max-tokens", "500", "--kinds", "delta", "--no-model"])
    assert (args.max_tokens, args.kinds, args.no_model, args.repeats, args.logprobs) == (500, "delta", True, 1, 1)
