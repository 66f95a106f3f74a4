"""Measurements of LM sessions, reusable by ``execstate bench sessions``.

- ``checkpoint_vs_recompute(llm, recompute_llm, n)``: a session whose context holds ``n`` tokens;
  the time of ``checkpoint()`` and of ``rollback()`` to it (the state restored in place, KV
  shared), against recomputing the same state from its inputs (a fresh session stepping the same
  ``n - 1`` prompt tokens on ``recompute_llm``, which should have prefix caching off so every token
  is computed). Medians over ``repeats``.
- ``step_latency_under_load(llm, ...)``: wall time of interactive session steps (``input_len``
  new tokens, ``max_tokens`` generated) while the engine is saturated with batch requests (every
  sequence slot busy and ``queued`` more waiting), with the session's steps in the interactive
  priority class or in the batch class; also without any load. p50 / p95 / p99 / max in ms and
  every step's latency (``latencies_ms``).

All offline on one engine, single process; the caller picks the model (``execstate_bench/models.py``).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import replace
from typing import Any

import numpy as np

from execstate.engine.sampling_params import SamplingParams
from execstate.engine.scheduler import PRIORITY_BATCH, PRIORITY_INTERACTIVE
from execstate.session.lm.llm import LLM
from execstate_bench.machine import loadavg_1m

log = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, min(vocab, 30000), n).tolist()


def checkpoint_vs_recompute(llm: LLM, recompute_llm: LLM, context_len: int, repeats: int = 5) -> dict[str, Any]:
    vocab = llm.engine.model_config.vocab_size
    prompt = _prompt(context_len, context_len - 1, vocab)
    s = llm.open_session(sampling_params=GREEDY)
    s.step(prompt, max_tokens=1)  # context: context_len tokens, KV for all but the last
    cp_ms, rb_ms = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        cp = s.checkpoint()
        cp_ms.append((time.perf_counter() - t0) * 1e3)
        s.step([3 + i], max_tokens=1)  # move on, so the rollback has something to undo
        t0 = time.perf_counter()
        s.rollback(cp)
        rb_ms.append((time.perf_counter() - t0) * 1e3)
        s.release_checkpoint(cp)
    recompute_ms = []
    for _ in range(max(1, min(repeats, 3))):
        fresh = recompute_llm.open_session(sampling_params=GREEDY)
        t0 = time.perf_counter()
        fresh.step(prompt, max_tokens=1)
        recompute_ms.append((time.perf_counter() - t0) * 1e3)
        fresh.close()
    s.close()
    out = {"context_tokens": context_len, "checkpoint_ms": statistics.median(cp_ms),
           "rollback_ms": statistics.median(rb_ms), "recompute_ms": statistics.median(recompute_ms)}
    out["restore_speedup"] = out["recompute_ms"] / max(out["rollback_ms"], 1e-9)
    return out


def step_latency_under_load(
    llm: LLM, steps: int = 12, input_len: int = 8, max_tokens: int = 8, batch_prompt_len: int = 64,
    batch_max_tokens: int = 64, queued: int = 8, batch_class_steps: int | None = None,
) -> dict[str, Any]:
    """Interactive session step latency: no load; saturating batch load with the session in the
    interactive class; the same load with the session in the batch class (``batch_class_steps``
    steps, default ``steps``: each of its steps waits for the batch queue ahead of it)."""
    eng = llm.engine
    load = _BatchLoad(llm, batch_prompt_len, batch_max_tokens, eng.scheduler.max_num_seqs + queued)
    results: dict[str, Any] = {}
    for mode in ("no_load", "load_interactive", "load_batch_class"):
        priority = PRIORITY_BATCH if mode == "load_batch_class" else PRIORITY_INTERACTIVE
        n = batch_class_steps if mode == "load_batch_class" and batch_class_steps is not None else steps
        load_before = loadavg_1m()
        log.info("step latency: %s, %d steps (1-min load %.2f)", mode, n, load_before)
        lat = _session_steps(llm, f"bench-{mode}", priority, None if mode == "no_load" else load, n,
                             input_len, max_tokens)
        results[mode] = {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
                         "p95_ms": float(np.percentile(lat, 95)), "max_ms": float(max(lat)),
                         "latencies_ms": lat, "steps": n, "batch_requests": load.take_count(),
                         "loadavg_1m_before": load_before}
        load.stop()
    results["workload"] = {"input_len": input_len, "max_tokens": max_tokens, "batch_prompt_len": batch_prompt_len,
                           "batch_max_tokens": batch_max_tokens, "max_num_seqs": eng.scheduler.max_num_seqs,
                           "queued": queued}
    return results


class _BatchLoad:
    """Keeps ``target`` batch requests in the engine (every slot busy, the rest waiting)."""

    def __init__(self, llm: LLM, prompt_len: int, max_tokens: int, target: int) -> None:
        self.eng = llm.engine
        self.prompt_len, self.target = prompt_len, target
        self.params = replace(GREEDY, max_tokens=max_tokens)
        self.ids: set[str] = set()
        self.count = 0
        self.serial = 0

    def top_up(self) -> None:
        self.ids &= self.eng.requests.keys()
        while len(self.ids) < self.target:
            rid = f"bench-batch-{self.serial}"
            self.eng.add_request(_prompt(1000 + self.serial, self.prompt_len, self.eng.model_config.vocab_size),
                                 self.params, rid)
            self.ids.add(rid)
            self.serial += 1
            self.count += 1

    def take_count(self) -> int:
        n, self.count = self.count, 0
        return n

    def stop(self) -> None:
        for rid in list(self.ids):
            self.eng.abort_request(rid)
        self.ids.clear()


def _session_steps(llm: LLM, sid: str, priority: int, load: _BatchLoad | None, steps: int, input_len: int,
                   max_tokens: int) -> list[float]:
    eng = llm.engine
    sessions = llm.sessions
    vocab = eng.model_config.vocab_size
    sessions.open(sid, replace(GREEDY, max_tokens=max_tokens), priority=priority)
    if load is not None:
        load.top_up()
        for _ in range(3):  # steady state: slots full, queue waiting
            eng.step()
    lat = []
    for k in range(steps):
        if load is not None:
            load.top_up()
        t0 = time.perf_counter()
        handle = sessions.start_step(sid, _prompt(k, input_len, vocab), max_tokens)
        while not handle.done:
            eng.step()
            if load is not None:
                load.top_up()
        lat.append((time.perf_counter() - t0) * 1e3)
        if handle.error is not None:
            raise handle.error
    sessions.close(sid)
    return lat
