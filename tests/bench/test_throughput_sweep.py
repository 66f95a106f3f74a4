"""The batch-size sweep of ``execstate bench throughput``: the roofline arithmetic (against brute
force and the safetensors contents), the bandwidth probe, the sweep on a tiny random MoE with the
engine alone (report, table, PNG), and its argument checks."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from execstate_bench.throughput_roofline import (
    ceiling_tok_s,
    expected_experts_read,
    kv_bytes_per_token,
    measure_bandwidth,
    roofline,
    step_bytes,
    weight_bytes,
)
from execstate_bench.throughput_sweep import SweepWorkload, parse_batches, run_throughput_sweep


def _brute_expected(e: int, k: int, b: int) -> Fraction:
    """Mean number of distinct experts over every equally likely way b tokens pick k of e."""
    choices = list(itertools.combinations(range(e), k))
    total = sum(len(set().union(*picks)) for picks in itertools.product(choices, repeat=b))
    return Fraction(total, len(choices) ** b)


@pytest.mark.parametrize(("e", "k", "b"), [(4, 2, 1), (4, 2, 3), (5, 2, 2), (6, 3, 2), (3, 1, 4), (8, 2, 2)])
def test_expected_experts_matches_brute_force(e, k, b):
    assert expected_experts_read(e, k, b) == pytest.approx(float(_brute_expected(e, k, b)), rel=1e-12)


@given(e=st.integers(1, 64), data=st.data())
def test_expected_experts_properties(e, data):
    k = data.draw(st.integers(1, e))
    vals = [expected_experts_read(e, k, b) for b in range(0, 40)]
    assert vals[0] == 0 and vals[1] == pytest.approx(k)
    assert all(a <= b_ + 1e-12 for a, b_ in zip(vals, vals[1:], strict=False)) and vals[-1] <= e + 1e-9


def test_expected_experts_rejects_bad_input():
    with pytest.raises(ValueError, match="top_k"):
        expected_experts_read(8, 9, 1)
    with pytest.raises(ValueError):
        expected_experts_read(8, 2, -1)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from execstate.model.random_models import make_random

    return make_random("qwen3_moe", tmp_path_factory.mktemp("sweep_moe"), seed=0)


def test_weight_bytes_partition_the_checkpoint(tiny_moe):
    from safetensors.torch import load_file

    sd = {}
    for f in tiny_moe.glob("*.safetensors"):
        sd.update(load_file(str(f)))
    cfg = json.loads((tiny_moe / "config.json").read_text())
    w = weight_bytes(tiny_moe, 4)
    assert not cfg["tie_word_embeddings"]
    assert w.dense + w.embedding + w.experts == 4 * sum(t.numel() for t in sd.values())
    assert w.experts == 4 * sum(t.numel() for n, t in sd.items() if ".mlp.experts." in n) > 0
    assert w.embedding == 4 * sd["model.embed_tokens.weight"].numel()
    assert w.embedding_row == 4 * cfg["hidden_size"]
    assert (w.num_experts, w.top_k) == (cfg["num_local_experts"], cfg["num_experts_per_tok"])
    assert weight_bytes(tiny_moe, 2).dense * 2 == w.dense  # bf16: half the bytes
    # batch 1 reads the dense weights, one embedding row and top_k of E experts
    k, e = w.top_k, w.num_experts
    assert step_bytes(w, 1) == pytest.approx(w.dense + w.embedding_row + w.experts * k / e)
    assert step_bytes(w, 10**6) == pytest.approx(w.dense + w.embedding + w.experts)
    assert ceiling_tok_s(w, 8, 20e9) == pytest.approx(8 * 20e9 / step_bytes(w, 8))
    r = roofline(tiny_moe, [1, 4], 10e9)
    assert r["bandwidth_gb_s"] == pytest.approx(10.0) and set(r["by_batch"]) == {"1", "4"}
    assert r["by_batch"]["4"]["experts_read_per_layer"] == pytest.approx(expected_experts_read(e, k, 4))
    assert kv_bytes_per_token(cfg) == 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4


def test_tied_embedding_is_read_once(tmp_path):
    from execstate.model.random_models import make_random

    path = make_random("llama", tmp_path / "dense", seed=0)
    cfg = json.loads((path / "config.json").read_text())
    w = weight_bytes(path, 4)
    if cfg.get("tie_word_embeddings"):
        assert w.embedding == 0 and w.embedding_row == 0  # counted in dense, once, via the head
    assert w.experts == 0 and step_bytes(w, 1) == step_bytes(w, 64) > 0


def test_measure_bandwidth_small():
    before = torch.get_num_threads()
    bw = measure_bandwidth(size_mib=16, repeats=2, threads=2)
    assert torch.get_num_threads() == before
    assert set(bw["by_threads"]) == {"1", "2"}
    assert bw["read"] == max(v["read"] for v in bw["by_threads"].values()) > 1e8  # > 0.1 GB/s on any machine


def test_parse_batches_and_workload_checks():
    assert parse_batches("8, 1,2,2") == (1, 2, 8)
    for bad in ("", "1,x", " , "):
        with pytest.raises(ValueError, match="--sweep"):
            parse_batches(bad)
    with pytest.raises(ValueError, match="batch sizes"):
        SweepWorkload((0, 2))
    with pytest.raises(ValueError, match="batch sizes"):
        SweepWorkload((1, 65))
    with pytest.raises(ValueError, match="max_new_tokens >= 2"):
        SweepWorkload((1,), 8, 1)
    wl = SweepWorkload((1, 2), 5, 3)
    a, b = wl.prompts(100, 2, 0, "prefill"), wl.prompts(100, 2, 0, "full")
    assert len(a) == 2 and all(len(p) == 5 for p in a) and a != b and a == wl.prompts(100, 2, 0, "prefill")


def test_sweep_engine_only_report_table_and_plot(tiny_moe, tmp_path, monkeypatch):
    import matplotlib.image

    from execstate_bench.throughput_plot import format_sweep_table, plot_sweep

    monkeypatch.delenv("EXECSTATE_VLLM_PYTHON", raising=False)
    wl = SweepWorkload((1, 2), prompt_len=8, max_new_tokens=6)
    report = run_throughput_sweep(str(tiny_moe), wl, repeats=1, num_threads=1, peers=False,
                                  bandwidth_gb_s=12.5, print_table=False)
    json.dumps(report)
    assert report["bandwidth"] == {"source": "given (--bandwidth-gbs)", "read_gb_s": 12.5}
    assert report["peers"]["vllm"] == {"available": False, "note": "peers disabled (--no-peers)"}
    eng = report["peers"]["execstate_r3_off"]
    assert set(eng["by_batch"]) == {"1", "2"} and eng["startup_seconds"]
    for b, x in eng["by_batch"].items():
        assert x["tokens_exact"] is True and len(x["total_s"]) == 1
        assert x["team_solo_share"] == [None]  # one thread: the governor has no team to choose
        ceiling = report["roofline"]["by_batch"][b]["ceiling_tok_s"]
        if x["decode_tok_s"] is not None:
            assert x["fraction_of_roofline"] == pytest.approx(x["decode_tok_s"] / ceiling)
    text = format_sweep_table(report)
    assert "roofline ceiling tok/s" in text and "12.5 GB/s" in text and "peers disabled" in text
    out = plot_sweep(report, tmp_path / "sweep.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(str(out)).shape[:2] == (660, 1320)  # 12 x 6 in at 110 dpi


def test_measured_roofline_uses_the_bandwidth_next_to_each_batch(tiny_moe, tmp_path, monkeypatch):
    """Without --bandwidth-gbs the sweep probes the bandwidth before each batch size's runs and
    each batch's ceiling uses the median of its probes (here: a fake probe whose figure moves)."""
    import execstate_bench.throughput_sweep as sweep
    from execstate_bench.throughput_plot import format_sweep_table, plot_sweep

    monkeypatch.delenv("EXECSTATE_VLLM_PYTHON", raising=False)
    calls = []

    def fake(size_mib=512, repeats=5, threads=1):
        calls.append(size_mib)
        gb = 50.0 if len(calls) == 1 else 10.0 * (len(calls) - 1)  # start: 50; then 10, 20, 30, 40
        return {"read": gb * 1e9, "copy": gb * 1e9, "size_mib": size_mib, "repeats": repeats,
                "by_threads": {"1": {"read": gb * 1e9, "copy": gb * 1e9}}}

    monkeypatch.setattr(sweep, "measure_bandwidth", fake)
    wl = SweepWorkload((1, 2), prompt_len=8, max_new_tokens=6)
    report = run_throughput_sweep(str(tiny_moe), wl, repeats=2, num_threads=1, peers=False, print_table=False)
    assert calls == [512] + [sweep.ADJACENT_PROBE_MIB] * 4  # start, then before (repeat, batch) 1, 2, 1, 2
    bw = report["bandwidth"]
    assert bw["read_gb_s"] == 50.0 and bw["next_to_runs_gb_s"] == {"1": [10.0, 30.0], "2": [20.0, 40.0]}
    roof = report["roofline"]
    assert roof["bandwidth_gb_s_by_batch"] == {"1": 20.0, "2": 30.0} and roof["bandwidth_gb_s"] == 25.0
    w = weight_bytes(tiny_moe, 4)
    for b, gb in ((1, 20.0), (2, 30.0)):
        assert roof["by_batch"][str(b)]["ceiling_tok_s"] == pytest.approx(ceiling_tok_s(w, b, gb * 1e9))
    text = format_sweep_table(report)
    assert "next to each batch size's runs (20.0-30.0 GB/s)" in text and "start of the sweep 50.0 GB/s" in text
    assert plot_sweep(report, tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no bandwidth for batch sizes"):
        roofline(tiny_moe, [1, 4], {1: 1e9})


def test_starved_peers_are_noted():
    from execstate_bench.throughput_sweep import _note_starved

    report = {"notes": [], "peers": {
        "a": {"by_batch": {"1": {"cpu_share": [0.5, 0.6, 0.1]}, "2": {"cpu_share": [0.4]}}},
        "b": {"by_batch": {"1": {"cpu_share": [0.95, 0.9]}}},
        "c": {"available": False, "note": "absent"}}}
    _note_starved(report)
    assert report["median_cpu_share"] == {"a": pytest.approx(0.45), "b": pytest.approx(0.925)}
    assert len(report["notes"]) == 1 and "a 0.45" in report["notes"][0] and "b " not in report["notes"][0]
    report = {"notes": [], "peers": {"b": {"by_batch": {"1": {"cpu_share": [0.9]}}}}}
    _note_starved(report)
    assert report["notes"] == []
