"""The interleaved peer loop of ``execstate bench throughput``: every timed run of every peer.

Peers run side by side in one process, interleaved per repeat: every peer runs repeat r
before any peer runs repeat r+1, and the peer order rotates every repeat, so no peer always
runs first or right after another and machine noise hits them alike. When the weights of
all peers fit in memory together (``resident``) every peer is loaded once and comparable
runs are adjacent in time (batch shape outer, peers inner); otherwise each peer is loaded,
warmed up, measured on both batch shapes and closed, in turn, every repeat.

A short warm-up per load (batch 8 on 2 prompts, batch 1 on 1, ``WARMUP_NEW_TOKENS`` each,
on prompts of their own) precedes the timed runs. Per run the loop records wall seconds,
generated tokens per prompt, batch-1 TTFTs where the peer reports them, the 1-minute load
average before the run, the share of the machine this process got (CPU s / (wall s x
threads)), and over the call the host's steal and the other processes' CPU time as shares of
all CPUs' time (``machine.machine_shares``: a run slowed with neither was slowed by its own
work); after each repeat every peer's greedy tokens are compared with the engine's (R3 on; a
peer beside another numerics mode: that mode's engine, ``Peer.parity_reference``), see
``execstate_bench.parity``.
"""

from __future__ import annotations

import gc
import itertools
import time
from dataclasses import dataclass
from typing import Any

from execstate_bench.machine import cpu_jiffies, loadavg_1m, machine_shares, others_share, settle
from execstate_bench.parity import add_counts, compare
from execstate_bench.peers import EnginePeer, Peer
from execstate_bench.throughput_pairs import PrefillPairs
from execstate_bench.throughput_workload import Workload

WARMUP_NEW_TOKENS = 4
REFERENCE_PEER = "execstate_r3_on"
_SAMPLE_KEYS = ("b8_s", "b8_tok", "b8_cpu_share", "b8_load", "b8_r3_share", "b8_steal", "b8_others", "b8_settle",
                "b1_s", "b1_tok", "b1_cpu_share", "b1_load", "b1_r3_share", "b1_steal", "b1_others", "b1_settle",
                "b1_ttft", "b8_prefill_s")

# peer name -> "b8"/"b1" (batch shape) -> generated token ids per prompt, of one repeat
_Tokens = dict[str, dict[str, list[list[int]]]]


@dataclass
class Measured:
    """What the loop measured.

    ``samples[peer]``: per batch shape ``b8``/``b1``, one entry per timed run: ``_s`` wall
    seconds, ``_tok`` generated tokens per prompt, ``_cpu_share`` CPU s / (wall s x threads),
    ``_load`` the 1-minute load average before the run, ``_r3_share`` (engines) the share of
    the run's wall time its R3Clock measured, ``_steal`` / ``_others`` the host's steal and the
    other processes' CPU time over the call as shares of all CPUs' time, ``_settle`` the seconds waited
    before it for the machine to be quiet (``machine.settle``); ``b1_ttft``: every
    batch-1 TTFT; ``b8_prefill_s``: per batch-8 run, the batch's time to first token (peers that
    report it).
    ``parity[peer][shape]``: agreement counts with the engine (R3 on), summed over repeats.
    ``prefill_pairs``: the paired prefill probes' report (``PrefillPairs.report``), empty without.
    """

    samples: dict[str, dict[str, list[Any]]]
    parity: dict[str, dict[str, dict[str, int | None]]]
    repeats_done: int
    bench_seconds: float  # loading and warm-up of resident peers included
    prefill_pairs: dict[str, Any]


class PeerLoop:
    """Measures ``peers`` on ``workload``: ``run`` once, then ``close`` (frees resident peers)."""

    def __init__(self, peers: list[Peer], workload: Workload, vocab_size: int, threads: int,
                 resident: bool, prefill_pairs: int = 0) -> None:
        """``prefill_pairs``: after each repeat's batch-8 runs, that many paired prefill probes of
        the engine and its vLLM peer (``throughput_pairs``; resident peers only)."""
        self.peers, self.wl, self.vocab, self.threads, self.resident = peers, workload, vocab_size, threads, resident
        self.pairs = PrefillPairs(prefill_pairs) if prefill_pairs > 0 and resident else None
        self.samples: dict[str, dict[str, list[Any]]] = {p.name: {k: [] for k in _SAMPLE_KEYS} for p in peers}
        self.parity: dict[str, dict[str, dict[str, int | None]]] = {}
        self._warm_ids = itertools.count()

    def run(self, repeats: int, t_start: float, time_budget_s: float | None, notes: list[str]) -> Measured:
        """Up to ``repeats`` interleaved repeats. After each repeat, stop early (appending a note)
        when one more at the pace so far would end past ``time_budget_s`` seconds from ``t_start``."""
        t_bench = time.perf_counter()
        if self.resident:
            for p in self.peers:
                self._activate(p)
        repeats_done = 0
        t_loop = time.perf_counter()
        for r in range(repeats):
            elapsed = time.perf_counter() - t_start
            if r > 0 and time_budget_s is not None and elapsed + (time.perf_counter() - t_loop) / r > time_budget_s:
                notes.append(f"stopped after {r} of {repeats} repeats: one more would pass the {time_budget_s:.0f} s "
                             f"time budget ({elapsed:.0f} s spent); medians are over {r} runs")
                break
            repeats_done += 1
            self._repeat(r)
        return Measured(self.samples, self.parity, repeats_done, time.perf_counter() - t_bench,
                        self.pairs.report() if self.pairs is not None else {})

    def close(self) -> None:
        if self.resident:
            for p in self.peers:
                self._deactivate(p)

    def _repeat(self, r: int) -> None:
        wl = self.wl
        shapes = ((True, wl.prompts(self.vocab, r, "b8"), "b8"), (False, wl.prompts(self.vocab, r, "b1"), "b1"))
        tokens: _Tokens = {}
        # Peer order rotates every repeat, so no peer always runs first or right after another.
        order = self.peers[r % len(self.peers):] + self.peers[: r % len(self.peers)]
        if self.resident:  # batch shape outer, peers inner: comparable runs are adjacent in time
            for batched, prompts, key in shapes:
                for p in order:
                    self._measure(p, batched, prompts, key, tokens)
                if batched and self.pairs is not None:
                    self.pairs.run(self.peers, wl, self.vocab, r)
        else:
            for p in order:
                self._activate(p)
                for batched, prompts, key in shapes:
                    self._measure(p, batched, prompts, key, tokens)
                self._deactivate(p)
        self._compare_to_engine(tokens)

    def _activate(self, peer: Peer) -> None:
        peer.load()
        warm = self.wl.prompts(self.vocab, next(self._warm_ids), "warmup")
        if peer.batch8:
            peer.run(warm[:2], WARMUP_NEW_TOKENS, batched=True)  # 2 prompts: warm, not the full prefill
        peer.run(warm[:1], WARMUP_NEW_TOKENS, batched=False)
        if isinstance(peer, EnginePeer):
            peer.cached_tokens = 0  # the warm-up's batch-1 prompt hits its own batch-8 prefix
        peer.after_warmup()

    @staticmethod
    def _deactivate(peer: Peer) -> None:
        peer.close()
        gc.collect()

    def _measure(self, p: Peer, batched: bool, prompts: list[list[int]], key: str, tokens: _Tokens) -> None:
        if batched and not p.batch8:
            return
        s = self.samples[p.name]
        gc.collect()
        # the previous peer's leftover work (vLLM's processes go on for 0.5 s and more) ends first
        s[f"{key}_settle"].append(settle(until_quiet=True))
        load = loadavg_1m()
        cpu0, jiffies0, wall0 = time.process_time(), cpu_jiffies(), time.perf_counter()
        res = p.run(prompts, self.wl.new_tokens(p, batched), batched)
        jiffies1, own_s, wall_s = cpu_jiffies(), time.process_time() - cpu0, time.perf_counter() - wall0
        # share of the machine this process got: CPU seconds / (wall seconds x the threads it runs)
        cpu = res.cpu_seconds if res.cpu_seconds is not None else own_s
        s[f"{key}_cpu_share"].append(cpu / (res.seconds * p.threads_in_use(self.threads)))
        # the machine over the whole call (a batch-8 prefill probe included): the hypervisor's steal
        # and the CPU time of every other process, as shares of all CPUs' time
        s[f"{key}_steal"].append(machine_shares(jiffies0, jiffies1)[1])
        # (this process's CPU over the whole call: a peer's ``cpu_seconds`` leaves out its prefill
        # probe; for vLLM's peer its own processes count as others)
        s[f"{key}_others"].append(others_share(jiffies0, jiffies1, own_s, wall_s))
        s[f"{key}_load"].append(load)
        s[f"{key}_s"].append(res.seconds)
        s[f"{key}_tok"].append([len(t) for t in res.token_ids])
        if res.ttft_s:
            s["b1_ttft"].extend(res.ttft_s)
        if res.prefill_s is not None:
            s["b8_prefill_s"].append(res.prefill_s)
        if res.r3_seconds is not None:  # the engine's own R3 bookkeeping time, as a share of the run
            s[f"{key}_r3_share"].append(res.r3_seconds / res.seconds)
        tokens.setdefault(key, {})[p.name] = res.token_ids

    def _compare_to_engine(self, tokens: _Tokens) -> None:
        """Each peer's greedy tokens against its ``parity_reference``'s (the fp32 engine, R3 on,
        unless the peer names the engine mode of its own numerics)."""
        ref_of = {p.name: p.parity_reference for p in self.peers}
        for key, by_peer in tokens.items():
            for name, ids in by_peer.items():
                base = by_peer.get(ref_of.get(name, REFERENCE_PEER))
                if base is not None and name != REFERENCE_PEER:
                    add_counts(self.parity.setdefault(name, {}).setdefault(key, {}), compare(base, ids))
