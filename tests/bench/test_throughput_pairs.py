"""The paired prefill probes of ``execstate bench throughput --prefill-pairs``: order, prompts,
ratios, which pairs run; the engine peer's probe on a real engine and the vLLM peer's request."""

from __future__ import annotations

from pathlib import Path

import pytest

from execstate.model.random_models import make_random
from execstate_bench import throughput_pairs
from execstate_bench.peers import EnginePeer, Peer
from execstate_bench.throughput_pairs import PrefillPairs
from execstate_bench.throughput_workload import Workload
from execstate_bench.vllm_peer import VllmPeer


class ScriptedPeer(Peer):
    """Answers each probe with the next of ``seconds``, logging (name, prompts) in ``log``."""

    def __init__(self, name: str, seconds: list[float], log: list[tuple[str, list[list[int]]]]) -> None:
        self.name, self.seconds, self.log = name, list(seconds), log

    def prefill_once(self, prompts: list[list[int]]) -> float:
        self.log.append((self.name, prompts))
        return self.seconds.pop(0)


@pytest.fixture(autouse=True)
def no_settle(monkeypatch) -> list[bool]:
    calls: list[bool] = []
    monkeypatch.setattr(throughput_pairs, "settle", lambda until_quiet=False: calls.append(until_quiet) or 0.0)
    return calls


def test_pairs_alternate_share_prompts_and_report_ratios(no_settle) -> None:
    log: list[tuple[str, list[list[int]]]] = []
    wl = Workload(prompt_len=5, num_prompts=3)
    engine = ScriptedPeer("execstate_r3_off", [0.25, 0.30, 0.20, 0.28], log)
    vllm = ScriptedPeer("vllm", [0.30, 0.30, 0.22, 0.21], log)
    pairs = PrefillPairs(2)
    for r in range(2):
        pairs.run([engine, ScriptedPeer("transformers", [], log), vllm], wl, vocab=50, repeat=r)
    # engine first in even pairs, vLLM first in odd ones; every probe after a settle until quiet
    assert [name for name, _ in log] == ["execstate_r3_off", "vllm", "vllm", "execstate_r3_off"] * 2
    assert no_settle == [True] * 8
    # a pair's two probes share prompts; every pair has prompts of its own, of the workload's shape
    prompts = [log[i][1] for i in range(0, 8, 2)]
    assert all(log[i][1] == log[i + 1][1] for i in range(0, 8, 2))
    assert len({str(p) for p in prompts}) == 4
    assert all(len(p) == 3 and all(len(row) == 5 and max(row) < 50 for row in p) for p in prompts)
    rep = pairs.report()
    assert list(rep) == ["execstate_r3_off/vllm"]
    got = rep["execstate_r3_off/vllm"]
    assert got["engine_s"] == [0.25, 0.30, 0.20, 0.28] and got["peer_s"] == [0.30, 0.30, 0.22, 0.21]
    assert got["ratios"] == pytest.approx([1.2, 1.0, 1.1, 0.75])
    assert got["median_ratio"] == pytest.approx(1.05)
    assert got["min_ratio"] == pytest.approx(0.75) and got["max_ratio"] == pytest.approx(1.2)


def test_both_pairs_and_missing_peers() -> None:
    log: list[tuple[str, list[list[int]]]] = []
    wl = Workload(prompt_len=4, num_prompts=2)
    peers = [ScriptedPeer("execstate_r3_off", [0.3], log), ScriptedPeer("execstate_bf16arith_r3_off", [0.2], log),
             ScriptedPeer("vllm_bf16", [0.3], log)]  # no fp32 vLLM: only the bf16 pair runs
    pairs = PrefillPairs(1)
    pairs.run(peers, wl, vocab=10, repeat=0)
    assert [name for name, _ in log] == ["execstate_bf16arith_r3_off", "vllm_bf16"]
    assert pairs.report()["execstate_bf16arith_r3_off/vllm_bf16"]["ratios"] == pytest.approx([1.5])
    assert PrefillPairs(3).report() == {}
    with pytest.raises(ValueError, match="prefill pairs must be >= 1"):
        PrefillPairs(0)


def test_engine_peer_probe_on_a_real_engine(tmp_path: Path) -> None:
    peer = EnginePeer(make_random("qwen3_moe", tmp_path / "m", seed=0), routes=False)
    peer.load()
    try:
        prompts = Workload(prompt_len=16, num_prompts=2).prompts(512, 0, "pairs")  # the random model's vocab
        assert peer.prefill_once(prompts) > 0.0
        assert peer.prefill_once(prompts) > 0.0  # again: the prompts' blocks are cached; still one call
    finally:
        peer.close()


def test_vllm_peer_probe_request() -> None:
    sent: list[dict] = []

    class Driver:
        def request(self, req: dict) -> dict:
            sent.append(req)
            return {"ok": True, "seconds": 0.42, "token_ids": [[7]], "prefill_seconds": None}

    peer = VllmPeer("python", "0.0", Path("m"), threads=2, max_model_len=64)
    peer.proc = Driver()  # type: ignore[assignment]
    assert peer.prefill_once([[1, 2, 3]]) == 0.42
    assert sent == [{"op": "generate", "prompts": [[1, 2, 3]], "max_tokens": 1, "batched": True,
                     "probe_prefill": False}]
    assert peer.prefill_batched == []  # the loop's probe figures are left alone
