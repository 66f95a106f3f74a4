"""Measurements of live session migration (docs/sessions-migration.md), for ``execstate
bench sessions`` (``measure_migration``) and standalone::

    python -m execstate_bench.session_migration --model standard --context 4000 --out result.json

Two engines in one process, each with a PD connector (``kv_both``, one shared secret), the
migration as ``execstate.session.lm.migration.migrate_session`` runs it, split into its phases:

- **migration**: a session whose context holds ``context_len`` tokens (KV for all but the last)
  moves from the source to the target: ``export_s`` (freeze, pin and checksum the full blocks,
  encode and sign the control state), ``import_s`` (the target: checks, load over ZeroMQ + NIXL,
  per-block checksums, session created), ``finish_s`` (the source closes its session) and
  ``migrate_s`` (all of it); then ``first_step_s``: the target's first step (1 new token, 1
  generated: it also recomputes the partial tail), against ``in_place_step_s``: the same step at
  the source just before (then rolled back); their tokens and routes must be equal
  (``tokens_equal``). Medians over ``repeats`` (after one uncounted warm-up migration), each
  with a fresh prompt (so the target's prefix cache never helps).
- **recompute**: the same state rebuilt from its inputs on an engine with prefix caching off (a
  fresh session stepping the same ``context_len - 1`` prompt tokens, one generated); **state
  recovery overhead** = ``migrate_s / recompute_s`` (docs/contracts.md 9).
- **failure recovery** (per fault mode, injected on the target's loads): migration start -> the
  error reported (``detect_s``) -> the source session served again: its next step done
  (``recovery_s``). ``drop`` is bounded by the connector's ``timeout_s``. Medians over
  ``failure_repeats``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from execstate.engine.pd_connector import PDConfig
from execstate.engine.sampling_params import SamplingParams
from execstate.session.lm.llm import LLM
from execstate.session.lm.migration import migrate_session, wait_import
from execstate.session.lm.migration_source import begin_export, finish_export
from execstate.session.lm.migration_target import begin_import
from execstate.session.lm.migration_wire import MigrationError
from execstate_bench.faults import FaultInjection, importer_factory

GREEDY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
SECRET = "bench-session-migration-secret-0123"


def _llm(model_dir: Path, num_kv_blocks: int, faults: dict | None = None, timeout_s: float = 10.0,
         pd: bool = True, **kw: Any) -> LLM:
    """An engine holding two contexts (``num_kv_blocks`` blocks, ``max_model_len`` to match)."""
    kw.setdefault("max_model_len", num_kv_blocks * 16 // 2)
    cfg = PDConfig(role="kv_both", secret=SECRET, timeout_s=timeout_s) if pd else None
    make_importer = None if faults is None else importer_factory(FaultInjection.from_dict(faults))
    return LLM(str(model_dir), enable_return_routed_experts=True, seed=0, num_kv_blocks=num_kv_blocks,
               kv_transfer=cfg, make_importer=make_importer, **kw)


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, min(vocab, 30000), n).tolist()


def measure_migration(model_dir: str | Path, context_len: int = 4000, repeats: int = 3, recompute_repeats: int = 2,
                      fault_modes: tuple[str, ...] = ("corrupt", "drop"), fault_timeout_s: float = 1.0,
                      failure_repeats: int = 3, num_kv_blocks: int | None = None) -> dict[str, Any]:
    """Migration vs recompute and failure recovery (module docstring); a JSON-able dict. Every
    engine is built (and its pool mapped) before anything is timed."""
    model_dir = Path(model_dir)
    blocks = num_kv_blocks or 2 * -(-(context_len + 32) // 16) + 8  # two contexts at block size 16
    src, dst = _llm(model_dir, blocks), _llm(model_dir, blocks)
    faulty = {m: _llm(model_dir, blocks, faults={"mode": m, "delay_s": 0.0}, timeout_s=fault_timeout_s)
              for m in fault_modes}
    recompute_llm = _llm(model_dir, blocks, pd=False, enable_prefix_caching=False)
    vocab = src.engine.model_config.vocab_size
    time.sleep(1.0)  # let the receivers' pool-mapping threads finish (KVPool.populate_async)
    try:
        runs = [_migrate_once(src, dst, _prompt(7000 + r, context_len - 1, vocab), f"bench-mig-{r}")
                for r in range(repeats + 1)][1:]  # the first one warms both engines up: not counted
        recompute_s = _recompute(recompute_llm, _prompt(7000, context_len - 1, vocab), recompute_repeats)
        failures = {}
        for i, (mode, target) in enumerate(faulty.items()):
            tries = [_failure_once(src, target, mode, _prompt(8000 + 10 * i + k, context_len - 1, vocab))
                     for k in range(failure_repeats)]
            failures[mode] = {"error": tries[0]["error"], "timeout_s": fault_timeout_s if mode == "drop" else None,
                              **{k: statistics.median(t[k] for t in tries)
                                 for k in ("detect_s", "next_step_s", "recovery_s")}}
    finally:
        for llm in (src, dst, *faulty.values()):
            if llm.engine.pd is not None:
                llm.engine.pd.close()
    med = {k: statistics.median(run[k] for run in runs) for k in
           ("export_s", "import_s", "finish_s", "migrate_s", "first_step_s", "in_place_step_s")}
    first = runs[0]
    out: dict[str, Any] = {
        "context_tokens": context_len, "repeats": repeats, **med, "recompute_s": recompute_s,
        "state_recovery_overhead": med["migrate_s"] / recompute_s,
        "resume_overhead": (med["migrate_s"] + med["first_step_s"]) / recompute_s,
        "kv_bytes": first["kv_bytes"], "control_bytes": first["control_bytes"], "offer_bytes": first["offer_bytes"],
        "blocks_transferred": first["blocks_transferred"], "tokens_recomputed": first["tokens_recomputed"],
        "tokens_equal": all(run["tokens_equal"] for run in runs), "failure_recovery": failures,
    }
    out["kv_gbps"] = out["kv_bytes"] / med["import_s"] / 1e9
    return out


def _migrate_once(src: LLM, dst: LLM, prompt: list[int], sid: str) -> dict[str, Any]:
    """One migration; the next step in place (then rolled back) is the reference and the baseline."""
    s = src.open_session(sampling_params=GREEDY, session_id=sid)
    s.step(prompt, max_tokens=1)
    cp = s.checkpoint()
    t0 = time.perf_counter()
    want = s.step([5], max_tokens=1)
    in_place_s = time.perf_counter() - t0
    s.rollback(cp)
    s.release_checkpoint(cp)
    t0 = time.perf_counter()
    assert dst.engine.pd is not None
    out = begin_export(src.sessions, sid, 60.0, target_engine_id=dst.engine.pd.instance_id,
                       nonce=secrets.token_hex(16))
    t1 = time.perf_counter()
    ok = False
    try:
        handle = begin_import(dst.sessions, out.payload)
        result = wait_import(dst.sessions, handle, out)
        ok = True
    finally:
        t2 = time.perf_counter()
        finish_export(src.sessions, out, ok)
    handle.commit()  # the two-phase hand-over: the target serves it once the source closed its copy
    t3 = time.perf_counter()
    moved = dst.session(sid)
    t4 = time.perf_counter()
    got = moved.step([5], max_tokens=1)
    t5 = time.perf_counter()
    moved.close()
    return {"export_s": t1 - t0, "import_s": t2 - t1, "finish_s": t3 - t2, "migrate_s": t3 - t0,
            "first_step_s": t5 - t4, "in_place_step_s": in_place_s, "kv_bytes": result.kv_bytes,
            "control_bytes": result.control_bytes, "offer_bytes": len(out.payload),
            "blocks_transferred": result.blocks_transferred, "tokens_recomputed": result.tokens_recomputed,
            "tokens_equal": got.token_ids == want.token_ids and got.routed_experts is not None
            and want.routed_experts is not None and got.routed_experts.tobytes() == want.routed_experts.tobytes()}


def _recompute(llm: LLM, prompt: list[int], repeats: int) -> float:
    times = []
    for _ in range(max(1, repeats)):
        s = llm.open_session(sampling_params=GREEDY)
        t0 = time.perf_counter()
        s.step(prompt, max_tokens=1)
        times.append(time.perf_counter() - t0)
        s.close()
    return statistics.median(times)


def _failure_once(src: LLM, target: LLM, mode: str, prompt: list[int]) -> dict[str, Any]:
    s = src.open_session(sampling_params=GREEDY, session_id=f"bench-fail-{mode}")
    s.step(prompt, max_tokens=1)
    s.step([4], max_tokens=1)  # warm: the measured step is an ordinary next step
    t0 = time.perf_counter()
    code = None
    try:
        migrate_session(s, target)
    except MigrationError as e:
        code = e.code
    t1 = time.perf_counter()
    s.step([5], max_tokens=1)
    t2 = time.perf_counter()
    s.close()
    return {"error": code, "detect_s": t1 - t0, "recovery_s": t2 - t0, "next_step_s": t2 - t1}


def main(argv: list[str] | None = None) -> int:
    from execstate.help_text import plain

    ap = argparse.ArgumentParser(description=plain(__doc__.split("\n\n")[0]))
    ap.add_argument("--model", default="standard", help="'standard', an embedded model or a directory")
    ap.add_argument("--context", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from execstate_bench.models import resolve_bench_model

    result = measure_migration(resolve_bench_model(args.model), args.context, args.repeats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
