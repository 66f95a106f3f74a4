"""The R3 paired bench's pooling (``execstate_bench/r3_paired.py``), on made-up runs."""

from __future__ import annotations

from typing import Any

import pytest

from execstate_bench.r3_paired import BUILD_ORDERS, format_r3_table, summarize_pairs


def _run(step_ms: float, lm_head_us: float, load: float, position: int = 0) -> dict[str, Any]:
    return {"cpu_step_s": step_ms / 1e3, "wall_step_s": step_ms / 1e3 * 1.1, "r3_share": 0.01, "load": load,
            "position": position, "segments": {"lm_head": lm_head_us / 1e6, "step": step_ms / 1e3}}


def test_summary_is_off_over_on_with_deltas_on_minus_off() -> None:
    pairs = [{False: _run(4.0, 1000, 0.5), True: _run(5.0, 1200, 0.7, 1)},
             {False: _run(4.0, 1000, 0.6, 1), True: _run(4.0, 1100, 0.4)},
             {False: _run(3.0, 900, 0.5), True: _run(4.0, 1000, 0.5, 1)}]
    s = summarize_pairs(pairs)
    assert s["pairs"] == 3
    assert s["cpu_ratio_on_over_off"] == pytest.approx({"median": 0.8, "min": 0.75, "max": 1.0})
    assert s["cpu_ratio_by_run_order"] == pytest.approx({"off_ran_first": 0.775, "on_ran_first": 1.0})
    assert s["wall_ratio_on_over_off"]["median"] == pytest.approx(0.8)
    assert s["cpu_step_ms"] == pytest.approx({"off": 4.0, "on": 4.0})
    assert s["segment_delta_us"]["lm_head"] == pytest.approx(100.0)
    assert s["load"] == [0.4, 0.7]


def test_table_has_a_row_per_build_order() -> None:
    a = [{False: _run(4.0, 1000, 0.5), True: _run(4.4, 1200, 0.5, 1)}]  # second-built engine slower
    b = [{False: _run(4.4, 1200, 0.5, 1), True: _run(4.0, 1000, 0.5)}]  # the other order: it cancels
    row = summarize_pairs(a + b)
    row["orders"] = {"off_first": summarize_pairs(a), "on_first": summarize_pairs(b)}
    assert list(BUILD_ORDERS) == ["off_first", "on_first"]
    assert row["cpu_ratio_on_over_off"]["median"] == pytest.approx(1.0, abs=0.005)
    report = {"control": True, "repeats": 1, "model": "standard", "prompt_len": 8, "max_tokens": 4,
              "build_orders": list(BUILD_ORDERS), "batches": {"8": row}}
    lines = format_r3_table(report).splitlines()
    assert lines[0].startswith("A/A control") and "ABBA" not in lines[0] and "off_first, on_first" in lines[0]
    assert lines[3].startswith("| 8 | 1.00") and lines[3].endswith("| 0.909 / 1.100 |")
    assert lines[4].startswith("| 8, off first | 0.909")
    assert lines[5].startswith("| 8, on first | 1.100")
