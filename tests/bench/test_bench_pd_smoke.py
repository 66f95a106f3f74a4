"""Smoke test of ``execstate bench pd`` on a tiny random Qwen3-MoE: real subprocesses
(single instance, prefill, decode, proxies, corrupting decode instances) on 127.0.0.1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

PROMPT_LEN, NUM_PROMPTS, MAX_TOKENS, REPEATS = 64, 2, 4, 1


def _execstate_children() -> list[int]:
    """Live child processes of this process that run ``-m execstate``."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == me and stat[0] != "Z" and b"execstate" in cmd:
            out.append(int(d.name))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from execstate.model.random_models import make_random
    from execstate_bench.pd import run_pd_bench

    path = make_random("qwen3_moe", tmp_path_factory.mktemp("bench_pd"), seed=0)
    return run_pd_bench(model=str(path), prompt_len=PROMPT_LEN, num_prompts=NUM_PROMPTS,
                        max_tokens=MAX_TOKENS, repeats=REPEATS, threads=1)


def test_report_structure(report):
    json.dumps(report)  # the CLI prints it with --json
    assert report["workload"] == {"prompt_len": PROMPT_LEN, "num_prompts": NUM_PROMPTS,
                                  "max_tokens": MAX_TOKENS, "repeats": REPEATS, "seed": 0}
    assert report["n_moe_layers"] == 2 and report["top_k"] == 2  # tiny qwen3_moe: mlp_only_layers=[1]
    for name in ("single", "pd"):
        e = report["paths"][name]
        assert len(e["ttft_s"]) == len(e["tok_s"]) == NUM_PROMPTS * REPEATS
        assert all(0 < t < 30 for t in e["ttft_s"]) and e["median_ttft_s"] > 0 and e["median_tok_s"] > 0
        assert all(r["tokens"] == MAX_TOKENS for r in e["runs"])
        assert e["prefix_hit_tokens"] == 0  # fresh prompt per request: nothing hits a prefix cache
    assert report["ratios"]["ttft_pd_over_single"] > 0 and report["ratios"]["ttft_target"] == 1.3
    for r in report["paths"]["pd"]["runs"]:
        assert r["sources"] == {"local_cache": 0, "offloaded": 0, "transferred": PROMPT_LEN - 1, "computed": 1}
        assert r["server_ttft_s"]["prefill"] > 0 and r["server_ttft_s"]["decode"] > 0 and r["transfer_s"] > 0
    assert set(report["idle_profile"]) == {"single", "prefill", "decode"}


def test_no_token_mismatch(report):
    assert report["correctness"] == {"compared": NUM_PROMPTS * REPEATS, "token_mismatches": 0, "mismatched": []}


def test_transfer_figures(report):
    t = report["transfer"]
    assert t["transfers"] == NUM_PROMPTS * REPEATS and t["failures"] == 0
    # 4 full blocks of 16 tokens; per token: 3 layers x K,V x 2 kv heads x head_dim 32 x 4 bytes
    assert t["kv_bytes_per_request"] == 4 * 16 * 3 * 2 * 2 * 32 * 4
    assert t["route_bytes_per_token"] == 2 * 2 * 2
    assert t["route_bytes_per_request"] == (PROMPT_LEN - 1) * 8
    assert t["control_bytes_per_request"] > t["route_bytes_per_request"]  # routes travel in the manifest
    assert 0 < t["control_over_kv"] < t["route_plus_control_over_kv"] < 1
    assert t["bandwidth_bytes_per_s"] > 0 and t["transfer_seconds_per_request"] > 0


def test_failure_detected_and_recovery_measured(report):
    rc = report["recovery"]
    f = rc["failure"]
    assert f["error_detected"] and "checksum" in f["error"] and f["tokens_before_error"] == 0
    assert f["decode_transfer_failures"] == 1 and f["faulty_decode_healthy_after"]
    assert rc["retry_ok"] and 0 < rc["recovery_first_token_s"] <= rc["recovery_s"] < 30
    assert rc["injection_to_served_s"] > rc["recovery_s"]
    r = rc["recompute"]
    assert r["ok"] and r["tokens_equal_single"] and r["ttft_s"] > 0
    src = r["prompt_token_sources"]  # the middle of 4 blocks is corrupted: 2 verified, the rest recomputed
    assert src == {"local_cache": 0, "offloaded": 0, "transferred": 32, "computed": PROMPT_LEN - 32}
    assert r["decode_transfer_failures"] == 1


def test_every_process_stopped(report):
    assert report["bench_seconds"] > 0
    assert _execstate_children() == []


def test_table_renders(report):
    from execstate_bench.pd import format_table

    text = format_table(report)
    assert "TTFT PD / single" in text and "recovery" in text and "0 token mismatches" in text


def test_listens_on_names_the_process_holding_the_port(tmp_path):
    """The health check's sender check: this process's listening socket is found under its own
    pid, not under another process's, and a closed port under nobody's."""
    import socket
    import subprocess
    import sys

    from execstate_bench.pd_cluster import listens_on

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert listens_on(os.getpid(), port)
            assert not listens_on(other.pid, port)
        finally:
            other.kill()
            other.wait()
    assert not listens_on(os.getpid(), port)


def test_cluster_never_gives_two_processes_one_port(monkeypatch, tmp_path):
    """The OS may hand the same free port out twice in a row; a cluster draws again."""
    import subprocess

    import execstate_bench.pd_cluster as pc

    ports = iter([41001, 41001, 41001, 41002])
    monkeypatch.setattr(pc, "free_port", lambda: next(ports))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: None)
    cluster = pc.Cluster(threads=1, logdir=tmp_path)
    assert cluster.spawn("a", ["serve"], 1).endswith(":41001")
    assert cluster.spawn("b", ["serve"], 1).endswith(":41002")
    assert [p.port for p in cluster.procs.values()] == [41001, 41002]
