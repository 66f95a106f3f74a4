"""Smoke test of ``execstate bench load`` on a tiny random Qwen3-MoE: a real server process,
concurrent streaming clients (some cut), a flood past the waiting-queue bound."""

from __future__ import annotations

import json

import pytest

from execstate.model.random_models import make_random
from execstate_bench.load import format_load_report, run_load_bench

SEQS, WAITING, CLIENTS, FLOOD = 2, 2, 4, 24


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = make_random("qwen3_moe", tmp_path_factory.mktemp("bench_load"), seed=0)
    return run_load_bench(model=str(path), clients=CLIENTS, rounds=1, prompt_len=16, max_tokens=12, cut_every=2,
                          cut_after=3, flood=FLOOD, flood_max_tokens=2, max_num_seqs=SEQS, max_waiting=WAITING,
                          threads=1)


def test_steady_phase_served_and_cut(report):
    json.dumps(report)
    s = report["steady"]
    assert (s["served"], s["cut"], s["refused"], s["error"]) == (2, 2, 0, 0)  # clients 0 and 2 cut
    assert s["ttft_p50_s"] > 0 and s["itl_p99_s"] >= s["itl_p50_s"] > 0


def test_flood_is_refused_beyond_the_bound_with_retry_after(report):
    f = report["flood"]
    assert f["error"] == 0 and f["served"] + f["refused"] == FLOOD
    assert f["served"] >= SEQS + WAITING and f["refused"] >= 1  # 24 at once: the bound was reached
    assert f["refused_with_retry_after"] == f["refused"]


def test_nothing_leaked_and_healthy(report):
    assert report["after"] == {"kv_blocks_leaked": 0, "running": 0, "waiting": 0, "healthy": True}
    assert report["ok"] is True
    assert "KV blocks leaked 0" in format_load_report(report)


def test_steady_clients_beyond_the_bound_are_a_value_error():
    with pytest.raises(ValueError, match="exceeds max_num_seqs"):
        run_load_bench(model="unused", clients=5, max_num_seqs=2, max_waiting=2)
