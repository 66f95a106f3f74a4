"""Smoke test of ``execstate bench weights`` on a tiny random Qwen3-MoE (structure, not speed)."""

from __future__ import annotations

import json

from execstate.cli import build_parser
from execstate.model.random_models import make_random
from execstate_bench.weights import format_weights_table, run_weights_bench


def test_weights_bench_report(tmp_path):
    path = make_random("qwen3_moe", tmp_path / "m", seed=0)
    report = run_weights_bench(model=str(path), repeats=2, threads=1, print_table=False)
    json.dumps(report)
    assert set(report["cases"]) == {"state_dict+hash", "state_dict+version", "path+hash", "path+version",
                                    "previous (reallocate+hash)"}
    for name, c in report["cases"].items():
        assert len(c["seconds"]) == 2 and c["median_s"] > 0
        if name.startswith(("state_dict", "path")):
            assert c["in_place"] is True
    assert report["breakdown"]["copy"]["gb_per_s"] > 0 and report["param_bytes"] > 0
    assert "state_dict+version" in format_weights_table(report)
    args = build_parser().parse_args(["bench", "weights", "--repeats", "3", "--json"])
    assert (args.bench_cmd, args.model, args.repeats, args.json) == ("weights", "smollm2-moe", 3, True)
