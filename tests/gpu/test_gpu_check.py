"""The device check runs end to end on the CPU (``--cpu``: tiny sizes, Triton's interpreter) and
writes its JSON and summary with every part present: the check of the check, so that the first
run on a GPU does not fail on a typo. Slow: the whole engine through the interpreter."""

from __future__ import annotations

import json

import pytest

from execstate_bench import gpu_check


@pytest.mark.slow
def test_gpu_check_cpu_mode_writes_every_part(tmp_path) -> None:
    assert gpu_check.main(["--out", str(tmp_path), "--cpu", "--budget", "900"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report["correctness"]) == {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe"}
    for arch, c in report["correctness"].items():
        assert "error" not in c, (arch, c)
        assert c["tokens_vs_cpu"] == ["equal"] * 3, (arch, c)
        assert c["prefix_hit"]["routes_equal_cold"], (arch, c)
    assert report["replay"] == {"bitwise": [True, True, True]}
    assert report["host_syncs"]["reads"] <= 1 and report["host_syncs"]["uploads"] == 0
    assert "error" not in json.dumps(report["speed"])
    assert (tmp_path / "summary.md").read_text().startswith("# execstate device check")
