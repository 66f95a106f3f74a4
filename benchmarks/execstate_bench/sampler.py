"""``execstate bench sampler``: the vectorised sampler against the per-row loop it replaced.

Times one ``sample`` call (best of ``repeats``, calls of the two samplers interleaved,
after a warm-up: on a shared machine the minimum is the least disturbed estimate) on random fp32 logits of
vocab 49152 (SmolLM2's) at batch 1, 8 and 64, for three workloads:

- ``greedy``: temperature 0 on every row;
- ``top_k+top_p``: temperature 0.8, top_k 50, top_p 0.95, half the rows seeded;
- ``penalties``: the same plus repetition 1.1, presence 0.5, frequency 0.5 after 100 and
  after 4000 generated tokens (random ids, so about as many distinct ones; 64 prompt
  tokens). New sampler only: the old one had no penalties. The state update is O(1) per
  token; the per-step work is O(distinct tokens seen) per row, bounded by the vocabulary.

``per_row_loop`` is the pre-issue-7 sampler (one ``torch.multinomial`` per row), kept here
only as the baseline.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from execstate.engine.penalties import PenaltyState
from execstate.engine.sampler import sample
from execstate.engine.sampling_params import SamplingParams

VOCAB = 49152
BATCHES = (1, 8, 64)


def per_row_loop(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> list[int]:
    """The old sampler: temperature/top-k/top-p and a multinomial draw, one row at a time."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    greedy_ids = torch.argmax(logits, dim=-1).tolist()
    tokens = []
    for i, p in enumerate(params):
        if p.greedy:
            tokens.append(greedy_ids[i])
            continue
        x = logits[i] / p.temperature
        if p.top_k is not None and p.top_k < x.shape[-1]:
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        probs = torch.softmax(x, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            sorted_p = sorted_p.masked_fill((cum - sorted_p) > p.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        tokens.append(int(torch.multinomial(probs, 1, generator=generators[i]).item()))
    logp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()
    return tokens


def _best_ms(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    """Best milliseconds per call of each function, calls interleaved (load hits all alike)."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()  # warm-up
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [min(ts) * 1e3 for ts in times]


def _params(kind: str, batch: int) -> list[SamplingParams]:
    if kind == "greedy":
        return [SamplingParams(temperature=0.0)] * batch
    pen: dict[str, Any] = (dict(repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)
                           if kind == "penalties" else {})
    return [
        SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=i if i % 2 else None, **pen) for i in range(batch)
    ]


def run_sampler_bench(repeats: int = 20, threads: int | None = None) -> dict[str, Any]:
    if threads is not None:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for batch in BATCHES:
        logits = torch.randn(batch, VOCAB, generator=gen) * 3
        for kind in ("greedy", "top_k+top_p"):
            params = _params(kind, batch)
            gens = [torch.Generator().manual_seed(i) for i in range(batch)]
            old, new = _best_ms([
                functools.partial(per_row_loop, logits, params, gens),
                functools.partial(sample, logits, params, list[torch.Generator | None](gens)),
            ], repeats)
            rows.append({"workload": kind, "batch": batch, "per_row_loop_ms": old, "vectorised_ms": new,
                         "speedup": old / new})
        for out_len in (100, 4000):
            params = _params("penalties", batch)
            gens = [torch.Generator().manual_seed(i) for i in range(batch)]
            outputs = [torch.randint(0, VOCAB, (out_len,), generator=gen).tolist() for _ in range(batch)]
            states = [PenaltyState(p, list(range(64)), out, VOCAB) for p, out in zip(params, outputs, strict=True)]

            def step(params=params, gens=gens, logits=logits, outputs=outputs, states=states) -> None:
                sample(logits, params, gens, None, states)
                for out in outputs:  # one new token per row, as in decoding
                    out.append(7)

            rows.append({"workload": f"penalties@{out_len}", "batch": batch, "per_row_loop_ms": None,
                         "vectorised_ms": _best_ms([step], repeats)[0], "speedup": None})
    return {"vocab": VOCAB, "threads": torch.get_num_threads(), "repeats": repeats, "rows": rows}


def format_sampler_table(report: dict[str, Any]) -> str:
    lines = [
        f"sampler, vocab {report['vocab']}, {report['threads']} torch threads, best of {report['repeats']}",
        f"{'workload':<16}{'batch':>6}{'per-row loop ms':>17}{'vectorised ms':>15}{'speed-up':>10}",
    ]
    for r in report["rows"]:
        old = f"{r['per_row_loop_ms']:.3f}" if r["per_row_loop_ms"] is not None else "-"
        up = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        lines.append(f"{r['workload']:<16}{r['batch']:>6}{old:>17}{r['vectorised_ms']:>15.3f}{up:>10}")
    return "\n".join(lines)
