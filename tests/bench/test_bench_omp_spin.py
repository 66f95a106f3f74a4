"""The bench process's OpenMP spin (execstate_bench/omp_spin.py): set before torch, the user's kept."""

from __future__ import annotations

from typing import Any

import pytest

from execstate_bench.omp_spin import ENV, SPIN_COUNT, set_spin


def test_set_spin_sets_the_count_before_torch() -> None:
    env: dict[str, str] = {"PATH": "/bin"}
    assert set_spin(env, {"os": object()}) == SPIN_COUNT == "3000000"
    assert env == {"PATH": "/bin", ENV: "3000000"}


def test_set_spin_keeps_a_value_already_set() -> None:
    env = {ENV: "123"}
    assert set_spin(env, {}) == "123"
    assert set_spin(env, {"torch": object()}) == "123"
    assert env == {ENV: "123"}


def test_set_spin_after_torch_changes_nothing_and_says_so() -> None:
    env: dict[str, str] = {}
    assert set_spin(env, {"torch": object()}) is None
    assert env == {}


def test_the_throughput_command_passes_the_spin_it_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import execstate_bench.throughput as throughput
    from execstate.cli import main

    seen: dict[str, Any] = {}
    monkeypatch.setattr(throughput, "run_throughput_bench", lambda **kw: seen.update(kw) or {"peers": {}})
    monkeypatch.setenv(ENV, "456")
    assert main(["bench", "throughput", "--model", "m", "--json"]) == 0
    assert seen["omp_spin"] == "456"
