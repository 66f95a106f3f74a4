"""``execstate bench throughput --json`` prints the report as JSON only (the table would make the output
unparseable), and ``--time-budget`` reaches the bench (on a loaded machine the default 600 s stops it after
one repeat)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from execstate.cli import main


def test_json_output_is_json_only_and_time_budget_passes(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import execstate.bench.throughput as throughput

    seen: dict[str, Any] = {}

    def run(**kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        if kwargs.get("print_table", True):
            print("a table")
        return {"model": kwargs["model"], "peers": {}}

    monkeypatch.setattr(throughput, "run_throughput_bench", run)
    assert main(["bench", "throughput", "--model", "m", "--json", "--time-budget", "1800"]) == 0
    assert json.loads(capsys.readouterr().out) == {"model": "m", "peers": {}}
    assert seen["print_table"] is False and seen["time_budget_s"] == 1800.0
    assert main(["bench", "throughput", "--model", "m"]) == 0
    assert capsys.readouterr().out.startswith("a table")
    assert seen["print_table"] is True and seen["time_budget_s"] == 600.0
