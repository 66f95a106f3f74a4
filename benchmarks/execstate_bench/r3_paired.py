"""``execstate bench throughput --r3-paired``: what route return (R3) costs a decode step, and where.

Two engines on the same weights, ``enable_return_routed_experts`` on and off, in one process;
each repeat draws fresh prompts and runs both on them, the order alternating (so the machine's
load hits both alike). The repeats run twice, in two build orders (ABBA): a pair built "off"
first, then a fresh pair built "on" first, so an instance effect of the second-built engine
cancels in the pooled ratio; the report has each order's figures too.
Both record their steps on the CPU clock (``EngineConfig.step_timers``:
what each phase costs the engine thread, whatever the time it spent descheduled), so the ratio
holds on a shared host where wall-clock ratios move by several percent run to run.

Per batch size the report has, over the repeats: the decode step's CPU time off / on (the R3
throughput ratio a quiet machine would show; paired per repeat, median, min, max), the same from
wall time, each segment's difference on - off (where the cost lands: ``inputs`` is building the
step's route capture, ``sample`` the rows copied into each request's trace, ``layers`` the routes
recorded per layer, ``python`` the rest), and the R3 clock's share (``engine/r3_clock.py``).

Both engines run their kernels on the whole team (``kernel_team="full"``, as ``--breakdown``
does): the engine thread's CPU time per step depends on the team size (on one thread it does all
of a layer's work, on two about half, plus its waits), and two adaptive governors
(``kernels/team.py``), one per engine, may hold different sizes: an A/A run with both adaptive
measured 1.77x between its two engines at batch 8 (18.4 / 10.4 ms of CPU per step, one engine on
one thread, the other on two). ``kernel_team="adaptive"`` measures with the governors anyway.

``control=True`` builds the same two engines with route return off in both (an A/A run; "on"
names the engine that would have it, built second in ``off_first`` and first in ``on_first``):
what two engine instances differ by with nothing else changed, the floor under which an on/off
difference is not R3's. Run each build order's figures against the other's: a ratio that flips
with the order is the build order's (an instance effect), not R3's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from execstate_bench.machine import loadavg_1m, settle


def _run(llm: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from execstate.engine.sampling_params import SamplingParams

    eng = llm.engine
    eng.step_timers.records.clear()
    r3_before = eng.r3_clock.seconds
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), use_tqdm=False)
    wall = time.perf_counter() - t0
    dec = [r for r in eng.step_timers.records if not r.prefill]
    seg = {k: statistics.fmean(r.segments[k] for r in dec) for k in dec[0].segments}
    seg["python"] = statistics.fmean(r.python for r in dec)
    return {"cpu_step_s": seg["step"], "wall_step_s": statistics.median(r.wall for r in dec), "segments": seg,
            "r3_share": (eng.r3_clock.seconds - r3_before) / wall, "wall_s": wall,
            "tokens": [list(o.outputs[0].token_ids) for o in outs]}


def summarize_pairs(pairs: list[dict[bool, dict[str, Any]]]) -> dict[str, Any]:
    """Over paired repeats (``{False: off run, True: on run}``, each as ``_run`` returns plus
    ``load``, and ``position``: 0 for the engine that ran first in its repeat): the CPU and wall
    ratios off / on (median, min, max), the CPU ratio's median over the repeats where off ran first
    and where on did (a run-order effect shows as the two apart; an odd count of repeats weights
    one order more), the median step CPU ms of each, each segment's median difference on - off
    (us), the R3 clock's median share and the load range."""
    cpu = [p[False]["cpu_step_s"] / p[True]["cpu_step_s"] for p in pairs]
    by_first = {name: [c for c, p in zip(cpu, pairs, strict=True) if p[first].get("position") == 0]
                for name, first in (("off_ran_first", False), ("on_ran_first", True))}
    wall = [p[False]["wall_step_s"] / p[True]["wall_step_s"] for p in pairs]
    segs = pairs[0][True]["segments"].keys()
    return {
        "pairs": len(pairs),
        "cpu_ratio_on_over_off": {"median": statistics.median(cpu), "min": min(cpu), "max": max(cpu)},
        "cpu_ratio_by_run_order": {k: statistics.median(v) if v else None for k, v in by_first.items()},
        "wall_ratio_on_over_off": {"median": statistics.median(wall), "min": min(wall), "max": max(wall)},
        "cpu_step_ms": {"off": statistics.median(p[False]["cpu_step_s"] for p in pairs) * 1e3,
                        "on": statistics.median(p[True]["cpu_step_s"] for p in pairs) * 1e3},
        "segment_delta_us": {k: statistics.median((p[True]["segments"][k] - p[False]["segments"][k]) * 1e6
                                                  for p in pairs) for k in segs},
        "r3_clock_share": statistics.median(p[True]["r3_share"] for p in pairs),
        "load": [min(p[o]["load"] for p in pairs for o in (False, True)),
                 max(p[o]["load"] for p in pairs for o in (False, True))],
    }


BUILD_ORDERS = {"off_first": (False, True), "on_first": (True, False)}


def run_r3_paired(model: str = "standard", batches: tuple[int, ...] = (1, 8), repeats: int = 6, prompt_len: int = 256,
                  max_tokens: int = 64, seed: int = 0, control: bool = False,
                  kernel_team: str = "full") -> dict[str, Any]:
    """The paired runs in two build orders (ABBA): a pair of engines built "off" first runs
    ``repeats`` repeats per batch size, then is dropped and a fresh pair built "on" first runs as
    many, so whatever the second-built engine gains or loses cancels in the pooled figures. Each
    batch's row pools both orders; ``orders`` has each order's own summary."""
    import gc

    from execstate.session.lm.llm import LLM
    from execstate_bench.models import resolve_bench_model

    path = resolve_bench_model(model)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"model": str(model), "prompt_len": prompt_len, "max_tokens": max_tokens,
                           "repeats": repeats, "control": control, "kernel_team": kernel_team,
                           "build_orders": list(BUILD_ORDERS), "batches": {}}
    by_order: dict[str, dict[int, list[dict[bool, dict[str, Any]]]]] = {}
    for name, order in BUILD_ORDERS.items():
        engines = {on: LLM(str(path), enable_return_routed_experts=on and not control, step_timers="cpu",
                           kernel_team=kernel_team) for on in order}
        vocab = engines[False].engine.model_config.vocab_size
        for llm in engines.values():
            _run(llm, rng.integers(0, vocab, size=(2, 32)).tolist(), 4)  # warm-up
        by_order[name] = {}
        for b in batches:
            pairs = []
            for r in range(repeats):
                prompts = rng.integers(0, vocab, size=(b, prompt_len)).tolist()
                runs = {}
                for position, on in enumerate((False, True) if r % 2 == 0 else (True, False)):
                    settle()
                    load = loadavg_1m()
                    runs[on] = _run(engines[on], prompts, max_tokens)
                    runs[on]["load"] = load
                    runs[on]["position"] = position
                assert runs[True]["tokens"] == runs[False]["tokens"], "R3 changed the greedy tokens"
                pairs.append(runs)
            by_order[name][b] = pairs
        del engines, llm  # the pair's weights go before the next pair is built
        gc.collect()
    for b in batches:
        row = summarize_pairs([p for name in BUILD_ORDERS for p in by_order[name][b]])
        row["orders"] = {name: summarize_pairs(by_order[name][b]) for name in BUILD_ORDERS}
        out["batches"][str(b)] = row
    return out


def _table_row(label: str, row: dict[str, Any]) -> str:
    c, w, ms = row["cpu_ratio_on_over_off"], row["wall_ratio_on_over_off"], row["cpu_step_ms"]
    top = sorted(((v, k) for k, v in row["segment_delta_us"].items() if k != "step"), reverse=True)[:3]
    return (f"| {label} | {c['median']:.3f} ({c['min']:.3f}-{c['max']:.3f}) | {w['median']:.3f} "
            f"({w['min']:.3f}-{w['max']:.3f}) | {ms['off']:.2f} / {ms['on']:.2f} | "
            + ", ".join(f"{k} {v:+.0f}" for v, k in top)
            + f" | {100 * row['r3_clock_share']:.2f}% | {row['load'][0]:.1f}-{row['load'][1]:.1f} | "
            + " / ".join("-" if v is None else f"{v:.3f}" for v in row.get("cpu_ratio_by_run_order", {}).values())
            + " |")


def format_r3_table(report: dict[str, Any]) -> str:
    what = "A/A control, both engines R3 off" if report.get("control") else "R3 on / off"
    orders = report.get("build_orders", [])
    lines = [f"{what}, paired ({report['repeats']} alternated repeats"
             + (f" in each build order ({', '.join(orders)}), pooled per batch" if orders else "")
             + f", {report['model']}, {report['prompt_len']}-token prompts, {report['max_tokens']} new tokens, "
             f"kernel team {report.get('kernel_team', 'adaptive')})",
             "| batch | CPU ratio median (min-max) | wall ratio median (min-max) | step CPU ms off / on | "
             "largest deltas (us/step) | R3 clock share | load | CPU ratio, off ran first / on ran first |",
             "|---|---|---|---|---|---|---|---|"]
    for b, row in report["batches"].items():
        lines.append(_table_row(b, row))
        for name, sub in row.get("orders", {}).items():
            lines.append(_table_row(f"{b}, {name.replace('_', ' ')}", sub))
    return "\n".join(lines)


__all__ = ["BUILD_ORDERS", "format_r3_table", "run_r3_paired", "summarize_pairs"]
