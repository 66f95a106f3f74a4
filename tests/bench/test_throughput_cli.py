"""``execstate bench throughput --json`` prints the report as JSON only (the table would make the output
unparseable), and ``--time-budget`` reaches the bench (on a loaded machine the default 600 s stops it after
one repeat); an optional peer that is missing says why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from execstate.cli import main


def test_json_output_is_json_only_and_time_budget_passes(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import execstate_bench.throughput as throughput

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


def test_optional_peer_reports_why_it_is_unavailable() -> None:
    from execstate_bench.throughput import _llama_cpp_unavailable

    assert (
        _llama_cpp_unavailable("standard", True) == "only for the dense smollm2-135m (an F32 GGUF of the same weights)"
    )
    reason = _llama_cpp_unavailable("smollm2-135m", True)
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure is "not installed"
        assert reason is not None and reason.startswith("not installed (")
    else:
        assert reason is None
