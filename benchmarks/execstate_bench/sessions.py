"""``execstate bench sessions``: what long-lived sessions buy over re-sending requests.

Parts (``parts`` picks some, so a disturbed part can be rerun alone), each on fresh engines of
the bench model (``execstate_bench/models.py``; route return on, seed 0), offline in one process:

1. ``chat``: an N-turn chat as one session vs re-sending the history each turn, prefix caching on
   and off (``sessions_chat``): prefill tokens, TTFT and wall time per turn, identical tokens;
2. ``checkpoint``: checkpoint and rollback time vs recomputing the same state from its inputs at
   each context length (``session_measure.checkpoint_vs_recompute``; the recompute engine has
   prefix caching off); targets: checkpoint < 1 ms at any length, restore >= 100x faster than
   recompute at the longest;
3. ``latency``: interactive session step latency p50 / p95 / p99 / max without load, under a
   saturating batch load in the interactive class, and under it in the batch class
   (``session_measure.step_latency_under_load``); ``steps`` steps per mode, or
   ``batch_class_steps`` in the batch class (each of its steps waits behind the batch queue, for
   seconds; with few steps its p99 is about its maximum, which the table also shows);
4. ``migration``: migration and failure-recovery time, when this build has session migration
   (``sessions_migration_part``), else reported as not available.

Context lengths beyond the model's ``max_model_len`` (less the few tokens the checkpoint
measurement steps past its checkpoint) are clamped and the clamped length is reported. The 1-min
load average is recorded before each part (and before each chat repeat and context length).
The text table: ``sessions_table``.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from execstate.session.lm.llm import LLM
from execstate_bench.machine import cpu_name, loadavg, loadavg_1m
from execstate_bench.models import STANDARD, resolve_bench_model
from execstate_bench.session_measure import checkpoint_vs_recompute, step_latency_under_load
from execstate_bench.sessions_chat import PATHS, chat_vs_resend
from execstate_bench.sessions_migration_part import migration_part

log = logging.getLogger(__name__)

PARTS = ("chat", "checkpoint", "latency", "migration")
CHECKPOINT_TARGET_MS = 1.0
RESTORE_SPEEDUP_TARGET = 100.0
KV_CACHE_BYTES = 256 << 20  # per engine: enough for every part, small beside the shared machine's memory
LATENCY_MAX_NUM_SEQS = 8
STEP_MARGIN = 4  # tokens the checkpoint measurement adds past its context (a step of 1 + 1 generated)


def _llm(path: Path, **kw: Any) -> LLM:
    kw.setdefault("kv_cache_memory_bytes", KV_CACHE_BYTES)
    return LLM(str(path), enable_return_routed_experts=True, seed=0, **kw)


def _check(*llms: LLM) -> None:
    """Every block accounted for after a part (its engines are dropped when the part returns)."""
    for llm in llms:
        llm.engine.check_integrity()


def run_sessions_bench(
    model: str | Path = STANDARD, *, parts: tuple[str, ...] = PARTS, turns: int = 8, turn_len: int = 64,
    max_tokens: int = 32, chat_repeats: int = 3, contexts: tuple[int, ...] = (256, 1024, 4096),
    checkpoint_repeats: int = 5, steps: int = 40, batch_class_steps: int | None = None, step_input_len: int = 8,
    step_max_tokens: int = 8,
    batch_prompt_len: int = 64, batch_max_tokens: int = 64, queued: int = 8,
    max_num_seqs: int = LATENCY_MAX_NUM_SEQS, migration_repeats: int = 3, threads: int | None = 1,
) -> dict[str, Any]:
    """Run the chosen parts (module docstring) and return the report. ``threads``: torch intra-op
    threads for this process (None: all CPUs). One by default: the parts time small steps, and
    on a shared machine a second intra-op thread makes every op wait for it to be scheduled
    (measured on 2 cores at a load average of 4-5: an 8-turn chat of the three paths took ~11 s
    with 1 thread, ~30 s with 2, and its TTFTs varied several-fold with 2)."""
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"parts must be a non-empty subset of {PARTS}, got {list(parts)}")
    t_start = time.perf_counter()
    n_threads = int(threads or os.cpu_count() or 1)
    torch.set_num_threads(n_threads)
    path = resolve_bench_model(model)
    report: dict[str, Any] = {"model": str(model), "model_dir": str(path), "threads": n_threads,
                              "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count(),
                                          "loadavg_before": loadavg()},
                              "parts": list(parts), "loadavg_1m_before_part": {}}
    for part in PARTS:
        if part not in parts:
            continue
        report["loadavg_1m_before_part"][part] = loadavg_1m()
        log.info("sessions bench: part %s (1-min load %.2f)", part, report["loadavg_1m_before_part"][part])
        t0 = time.perf_counter()
        if part == "chat":
            report["chat"] = _chat(path, turns, turn_len, max_tokens, chat_repeats)
        elif part == "checkpoint":
            report["checkpoint"] = _checkpoint(path, contexts, checkpoint_repeats)
        elif part == "latency":
            report["latency"] = _latency(path, steps, batch_class_steps, step_input_len, step_max_tokens,
                                         batch_prompt_len, batch_max_tokens, queued, max_num_seqs)
        else:
            report["migration"] = migration_part(path, _clamped(path, contexts), migration_repeats)
        report.setdefault("part_seconds", {})[part] = time.perf_counter() - t0
        gc.collect()  # the part's engines go before the next part builds its own
    report["machine"]["loadavg_after"] = loadavg()
    report["bench_seconds"] = time.perf_counter() - t_start
    report["ok"] = _ok(report)
    return report


def _chat(path: Path, turns: int, turn_len: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    llms = {p: _llm(path, enable_prefix_caching=p != "resend_uncached") for p in PATHS}
    out = chat_vs_resend(llms, turns, turn_len, max_tokens, repeats, on_progress=log.info)
    _check(*llms.values())
    return out


def _clamped(path: Path, contexts: tuple[int, ...]) -> list[int]:
    """``contexts`` clamped to what the checkpoint part measures (the engine's max_model_len is
    the model's max_position_embeddings here)."""
    top = int(json.loads((path / "config.json").read_text())["max_position_embeddings"]) - STEP_MARGIN
    return [min(n, top) for n in contexts]


def _checkpoint(path: Path, contexts: tuple[int, ...], repeats: int) -> dict[str, Any]:
    llm, cold = _llm(path), _llm(path, enable_prefix_caching=False)
    rows = []
    for n, m in zip(contexts, _clamped(path, contexts), strict=True):
        load = loadavg_1m()
        log.info("sessions bench: checkpoint at %d tokens (1-min load %.2f)", m, load)
        row = checkpoint_vs_recompute(llm, cold, m, repeats)
        row.update(requested_tokens=n, loadavg_1m_before=load)
        rows.append(row)
    _check(llm, cold)
    longest = rows[-1] if rows else None
    return {
        "rows": rows, "repeats": repeats, "recompute_repeats": max(1, min(repeats, 3)),
        "checkpoint_target_ms": CHECKPOINT_TARGET_MS, "restore_speedup_target": RESTORE_SPEEDUP_TARGET,
        "checkpoint_ok": all(r["checkpoint_ms"] < CHECKPOINT_TARGET_MS for r in rows),
        "restore_ok": longest is not None and longest["restore_speedup"] >= RESTORE_SPEEDUP_TARGET,
    }


def _latency(path: Path, steps: int, batch_class_steps: int | None, input_len: int, max_tokens: int,
             batch_prompt_len: int, batch_max_tokens: int, queued: int, max_num_seqs: int) -> dict[str, Any]:
    llm = _llm(path, max_num_seqs=max_num_seqs)
    out = step_latency_under_load(llm, steps, input_len, max_tokens, batch_prompt_len, batch_max_tokens, queued,
                                  batch_class_steps)
    _check(llm)
    return out


def _ok(report: dict[str, Any]) -> bool:
    """The correctness checks (not the speed targets): identical tokens and the session's prefill."""
    chat = report.get("chat")
    return chat is None or bool(chat["ok"])
