"""Smoke test of ``execstate bench sessions`` on a tiny random Qwen3-MoE: the report's structure
and the invariants it measures (identical tokens across paths, the session's prefill per turn,
what prefix caching saves, restore vs recompute), not speed."""

from __future__ import annotations

import json
import logging
import re
import sys
import types

import pytest

from execstate.cli import main
from execstate.model.random_models import make_random
from execstate_bench import sessions_migration_part
from execstate_bench.sessions import PARTS, run_sessions_bench
from execstate_bench.sessions_chat import PATHS
from execstate_bench.sessions_table import format_sessions_table

TURNS, TURN_LEN, GEN, BLOCK = 4, 12, 6, 16
CONTEXTS = (48, 1000)  # the tiny model has 256 positions: 1000 is clamped to 256 - 4
STEPS, BATCH_CLASS_STEPS = 6, 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_random("qwen3_moe", tmp_path_factory.mktemp("bench_sessions"), seed=0)


@pytest.fixture(scope="module")
def report(model_dir):
    return run_sessions_bench(str(model_dir), parts=("chat", "checkpoint", "latency"), turns=TURNS, turn_len=TURN_LEN,
                              max_tokens=GEN, chat_repeats=2, contexts=CONTEXTS, checkpoint_repeats=3, steps=STEPS,
                              batch_class_steps=BATCH_CLASS_STEPS,
                              step_input_len=4, step_max_tokens=3, batch_prompt_len=16, batch_max_tokens=12, queued=2,
                              max_num_seqs=4, threads=1)


def test_report_structure(report):
    json.dumps(report)
    assert report["parts"] == ["chat", "checkpoint", "latency"] and "migration" not in report
    assert set(report["loadavg_1m_before_part"]) == {"chat", "checkpoint", "latency"}
    assert report["ok"] is True
    text = format_sessions_table(report)
    for needle in ("4-turn chat", "tokens identical across paths: True", "checkpoint < 1.0 ms",
                   "session in the interactive class", "checks ok"):
        assert needle in text


def test_chat_tokens_identical_and_session_computes_only_new_tokens(report):
    c = report["chat"]
    assert c["tokens_identical"] is True and c["mismatches"] == [] and c["compared_turns"] == 2 * TURNS * 2
    p = c["paths"]
    assert set(p) == set(PATHS)
    prompt = [TURN_LEN + k * (TURN_LEN + GEN) for k in range(TURNS)]  # the whole history + this user turn
    for name in PATHS:
        assert [t["prompt_tokens"] for t in p[name]["turns"]] == prompt
        for t in p[name]["turns"]:
            assert all(a + b == t["prompt_tokens"] for a, b in zip(t["computed"], t["cached"], strict=True))
            assert 0 < t["ttft_ms_min"] <= t["ttft_ms"] <= t["wall_ms"] and t["engine_ttft_ms"] > 0
    # per turn, one value per chat: the first turn computes its input, later ones their input + 1
    assert [t["computed"] for t in p["session"]["turns"]] == [[TURN_LEN] * 2] + [[TURN_LEN + 1] * 2] * (TURNS - 1)
    assert c["expected_session_computed"] == [TURN_LEN] + [TURN_LEN + 1] * (TURNS - 1)
    assert c["session_prefill_ok"] is True
    # re-sending without a cache computes the whole history; with one, all but the full blocks
    assert [t["computed"] for t in p["resend_uncached"]["turns"]] == [[n, n] for n in prompt]
    for k, t in enumerate(p["resend_cached"]["turns"]):
        cached_blocks = (prompt[k - 1] + GEN - 1) // BLOCK if k else 0  # KV of the previous turn's full blocks
        assert t["cached"] == [cached_blocks * BLOCK] * 2
    totals = {n: p[n]["total_computed"][0] for n in PATHS}
    assert totals["session"] < totals["resend_cached"] < totals["resend_uncached"] == sum(prompt)


def test_checkpoint_rows_clamped_and_restore_beats_recompute(report):
    c = report["checkpoint"]
    assert [r["context_tokens"] for r in c["rows"]] == [48, 252]
    assert [r["requested_tokens"] for r in c["rows"]] == list(CONTEXTS)
    for r in c["rows"]:
        assert min(r["checkpoint_ms"], r["rollback_ms"], r["recompute_ms"]) > 0
    longest = c["rows"][-1]  # a forward pass over 251 tokens against bookkeeping: a wide margin
    assert longest["checkpoint_ms"] < longest["recompute_ms"] and longest["rollback_ms"] < longest["recompute_ms"]
    assert c["checkpoint_ok"] in (True, False) and c["restore_ok"] in (True, False)


def test_latency_modes(report):
    lat = report["latency"]
    for mode in ("no_load", "load_interactive", "load_batch_class"):
        r = lat[mode]
        n = BATCH_CLASS_STEPS if mode == "load_batch_class" else STEPS
        assert r["steps"] == n and len(r["latencies_ms"]) == n
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"] == max(r["latencies_ms"])
    assert lat["no_load"]["batch_requests"] == 0 and lat["load_interactive"]["batch_requests"] >= 6


def test_migration_not_available_is_reported(model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, sessions_migration_part.MODULE, None)  # import raises ImportError
    rep = run_sessions_bench(str(model_dir), parts=("migration",), contexts=(32,), threads=1)
    assert rep["migration"]["available"] is False and rep["migration"]["results"] == []
    assert "not available in this build" in rep["migration"]["reason"]
    assert "migration: not available in this build" in format_sessions_table(rep)


def test_migration_part_calls_measure_migration_per_context(tmp_path, monkeypatch):
    calls = []

    def measure_migration(model_dir, context_len, repeats):
        calls.append((model_dir, context_len, repeats))
        if context_len == 64:
            raise RuntimeError("injected")
        return {"migrate_s": 0.0015, "first_step_s": 0.004, "tokens_equal": True, "extra": 7,
                "failure_recovery": {"corrupt": {"error": "checksum", "detect_s": 0.002, "recovery_s": 0.0125}}}

    fake = types.ModuleType(sessions_migration_part.MODULE)
    fake.measure_migration = measure_migration
    monkeypatch.setitem(sys.modules, sessions_migration_part.MODULE, fake)
    out = sessions_migration_part.migration_part(tmp_path, [32, 64], 3)
    assert calls == [(tmp_path, 32, 3), (tmp_path, 64, 3)]
    assert out["available"] is True
    first, second = out["results"]
    assert (first["context_tokens"], first["migrate_s"], first["extra"]) == (32, 0.0015, 7)
    assert second["context_tokens"] == 64 and second["error"] == "RuntimeError: injected"
    text = format_sessions_table({"model": "m", "threads": 1, "machine": {"cpu": None, "cpu_count": 2},
                                  "loadavg_1m_before_part": {"migration": 0.5}, "migration": out})
    assert "error: RuntimeError: injected" in text
    assert re.search(r"\n +32 +1\.5 +4\.0 \(-\) +- +- +True ", text)  # ms; the keys it lacks: -
    assert "corrupt: checksum 2.0 / 12.5" in text


def test_nixl_log_lines_leave_stdout_for_the_report(tmp_path, monkeypatch):
    nixl = logging.getLogger("nixl")
    handler = logging.StreamHandler(sys.stdout)  # what NIXL installs when imported
    nixl.addHandler(handler)
    fake = types.ModuleType(sessions_migration_part.MODULE)
    fake.measure_migration = lambda model_dir, context_len, repeats: {}
    monkeypatch.setitem(sys.modules, sessions_migration_part.MODULE, fake)
    try:
        sessions_migration_part.migration_part(tmp_path, [8], 1)
        assert handler.stream is sys.stderr
    finally:
        nixl.removeHandler(handler)


def test_cli_runs_one_part_as_json(model_dir, capsys):
    logger = logging.getLogger("execstate")
    before = list(logger.handlers), logger.level
    try:  # main() installs the CLI's log handler on this test's captured stderr: taken off after
        rc = main(["bench", "sessions", "--model", str(model_dir), "--parts", "chat", "--turns", "2", "--turn-len",
                   "8", "--max-tokens", "2", "--repeats", "1", "--threads", "1", "--json"])
    finally:
        logger.handlers[:], logger.level = before[0], before[1]
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["parts"] == ["chat"] and rep["chat"]["tokens_identical"] is True
    assert [t["computed"] for t in rep["chat"]["paths"]["session"]["turns"]] == [[8], [9]]


def test_bad_parts_are_a_value_error():
    with pytest.raises(ValueError, match="parts must be"):
        run_sessions_bench("unused", parts=("chat", "nope"))
    assert PARTS == ("chat", "checkpoint", "latency", "migration")
