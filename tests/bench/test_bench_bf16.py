"""``execstate bench throughput --dtype bfloat16`` / ``--quantization gguf``: the engine's other numerics
modes join the same run, with their ratios (each mode over fp32; beside its own peer where one runs)."""

from __future__ import annotations

import pytest

from execstate.kernels import cpu


@pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
def test_bf16_peer_and_ratio(tmp_path) -> None:
    from execstate.cli import build_parser
    from execstate.model.random_models import make_random
    from execstate_bench.throughput import format_table, run_throughput_bench

    assert build_parser().parse_args(["bench", "throughput", "--dtype", "bfloat16"]).dtype == "bfloat16"
    path = make_random("qwen3_moe", tmp_path / "m", seed=0)
    report = run_throughput_bench(model=str(path), repeats=1, peers=False, num_threads=1, prompt_len=16,
                                  max_new_tokens=4, num_prompts=2, batch1_prompts=1, print_table=False,
                                  dtype="bfloat16")
    for name in ("execstate_bf16_r3_off", "execstate_bf16arith_r3_off"):
        peer = report["peers"][name]
        assert peer["batch8"]["tokens"] == [2 * 4] and peer["batch1"]["tokens"] == [4]
    for key in ("batch8", "batch1"):
        assert report["ratios"]["bf16_over_fp32"][key]["r3_off"] > 0
    arith = report["ratios"]["modes"]["execstate_bf16arith_r3_off/execstate_r3_off"]
    assert arith["batch8.median_tok_s"] > 0 and arith["batch1.decode_tok_s"] > 0
    table = format_table(report)
    assert "execstate bf16 weights (R3 off)" in table and "engine bf16 weights / fp32: batch8" in table
    assert "execstate bf16 (R3 off)" in table and "execstate_bf16arith_r3_off/execstate_r3_off: batch8" in table
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'bfloat16'"):
        run_throughput_bench(model=str(path), repeats=1, peers=False, dtype="float16")


@pytest.mark.skipif(not cpu.available(), reason=f"kernels unavailable: {cpu.unavailable_reason()}")
def test_engine_peer_times_nothing_while_its_kv_pool_is_being_mapped(tmp_path) -> None:
    from execstate.model.random_models import make_random
    from execstate_bench.peers import EnginePeer

    peer = EnginePeer(make_random("qwen3_moe", tmp_path / "m", seed=0), routes=False)
    peer.load()
    populate = peer.llm.engine.kv_populate
    assert populate is not None and not populate.is_alive()  # mapped before any timed run
    assert len(peer.populate_wait_seconds) == 1 and peer.populate_wait_seconds[0] >= 0
    peer.close()


def test_gguf_mode_peers_are_built_for_the_gguf_models_only(tmp_path) -> None:
    from execstate_bench.throughput import GGUF_BUILDS, mode_peers
    from execstate_bench.throughput_workload import Workload

    wl = Workload(16, 4, 2, 1, None, 0)
    with pytest.raises(ValueError, match="quantization='gguf' benches"):
        mode_peers("standard", tmp_path, wl, 1, "float32", "gguf", False, {})
    assert set(GGUF_BUILDS) == {"smollm2-135m", "smollm2-moe"}
    peers = mode_peers("standard", tmp_path, wl, 1, "bfloat16", None, False, {})
    assert [(p.name, p.storage, p.engine_kwargs) for p in peers] == [
        ("execstate_bf16_r3_off", "bf16", {"dtype": "bfloat16"}),
        ("execstate_bf16arith_r3_off", "bf16", {"dtype": "bfloat16", "compute_dtype": "bfloat16"})]


def test_mode_ratios_pair_each_mode_with_its_peer() -> None:
    from execstate_bench.throughput_report import _mode_ratios

    def peer(b8: float, b1: float, prefill: float | None = None) -> dict:
        return {"available": True, "batch8": {"median_tok_s": b8, "prefill_tok_s": prefill},
                "batch1": {"median_tok_s": b1, "decode_tok_s": b1 * 1.1}}

    ratios = _mode_ratios({"execstate_gguf_r3_off": peer(600.0, 150.0, 1000.0), "llama_cpp_q4_1": peer(200.0, 100.0),
                           "execstate_r3_off": peer(300.0, 50.0, 500.0), "vllm_bf16": {"available": False}})
    assert set(ratios) == {"execstate_gguf_r3_off/llama_cpp_q4_1", "execstate_gguf_r3_off/execstate_r3_off"}
    r = ratios["execstate_gguf_r3_off/llama_cpp_q4_1"]
    assert r["batch8.median_tok_s"] == 3.0 and r["batch1.median_tok_s"] == 1.5 and r["batch8.prefill_tok_s"] is None
    assert ratios["execstate_gguf_r3_off/execstate_r3_off"]["batch8.prefill_tok_s"] == 2.0


def test_bf16_over_vllm_prefill_uses_vllms_batched_prefill() -> None:
    """vLLM's prefill probe is kept beside its shapes (``prefill_batched_tok_s``); the bf16 mode's prefill
    ratio over vLLM bf16 is taken from it (it was ``None``)."""
    from execstate_bench.throughput_report import _mode_ratios

    ours = {"available": True, "batch8": {"median_tok_s": 500.0, "prefill_tok_s": 6000.0},
            "batch1": {"median_tok_s": 200.0, "decode_tok_s": 220.0}}
    vllm = {"available": True, "batch8": {"median_tok_s": 400.0}, "batch1": {"median_tok_s": 100.0,
                                                                            "decode_tok_s": 110.0},
            "prefill_batched_tok_s": 4000.0}
    r = _mode_ratios({"execstate_bf16arith_r3_off": ours, "vllm_bf16": vllm})["execstate_bf16arith_r3_off/vllm_bf16"]
    assert r == {"batch8.median_tok_s": 1.25, "batch8.prefill_tok_s": 1.5, "batch1.median_tok_s": 2.0,
                 "batch1.decode_tok_s": 2.0}
