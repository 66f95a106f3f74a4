"""Paired prefill probes of ``execstate bench throughput --prefill-pairs N``: an engine and its vLLM
peer alternated, one ``max_tokens=1`` batch each, back to back.

Why: the loop's batch-8 prefill probe runs once per peer per repeat, and a peer's probe follows
the other's by tens of seconds (decode runs in between), while this host's speed drifts by
several percent within minutes (docs/performance.md 16.21: the same build's prefill 246.8 ->
267.2 ms in three minutes). Over eleven quiet runs the fp32 engine / vLLM fp32 ratio of the
medians of two probes spread from 0.94x to 1.06x. Here each pair's two probes run on the same
fresh prompts (new for every pair, so no prefix cache hit), one right after the other, each
after a ``gc.collect()`` and ``settle(until_quiet=True)`` as the loop's runs, and their order
alternates (the engine first in even pairs, the peer in odd ones), so drift and position hit both
sides alike.

Per pair of peers in ``PAIRS`` present in the run: ``engine_s`` and ``peer_s`` (seconds, one per
pair), ``ratios`` (the peer's seconds over the engine's: above 1 the engine is faster) and their
median, min and max.
"""

from __future__ import annotations

import gc
from statistics import median
from typing import Any

from execstate_bench.machine import settle
from execstate_bench.peers import Peer
from execstate_bench.throughput_workload import Workload

# (engine, peer): the fp32 engine and vLLM fp32; the engine's bf16 arithmetic and vLLM bf16
PAIRS = (("execstate_r3_off", "vllm"), ("execstate_bf16arith_r3_off", "vllm_bf16"))


class PrefillPairs:
    """``n`` pairs per repeat for each of ``PAIRS`` whose two peers are in the run."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"prefill pairs must be >= 1, got {n}")
        self.n = n
        self.samples: dict[str, dict[str, list[float]]] = {}

    def run(self, peers: list[Peer], wl: Workload, vocab: int, repeat: int) -> None:
        """This repeat's pairs; every peer loaded (the loop's resident mode)."""
        by_name = {p.name: p for p in peers}
        for engine_name, peer_name in PAIRS:
            engine, peer = by_name.get(engine_name), by_name.get(peer_name)
            if engine is None or peer is None:
                continue
            s = self.samples.setdefault(f"{engine_name}/{peer_name}", {"engine_s": [], "peer_s": []})
            for j in range(self.n):
                prompts = wl.prompts(vocab, repeat * self.n + j, "pairs")
                seconds: dict[str, float] = {}
                for p in (engine, peer) if j % 2 == 0 else (peer, engine):
                    gc.collect()
                    settle(until_quiet=True)
                    seconds[p.name] = p.prefill_once(prompts)
                s["engine_s"].append(seconds[engine_name])
                s["peer_s"].append(seconds[peer_name])

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, s in self.samples.items():
            ratios = [p / e for p, e in zip(s["peer_s"], s["engine_s"], strict=True)]
            out[name] = {**s, "ratios": ratios, "median_ratio": median(ratios), "min_ratio": min(ratios),
                         "max_ratio": max(ratios)}
        return out
