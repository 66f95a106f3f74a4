"""The text table of a sessions bench report (``execstate bench sessions`` prints it)."""

from __future__ import annotations

from typing import Any

from execstate_bench.numbers import fmt, median, span

_LABELS = {"session": "session", "resend_cached": "re-send, prefix cache on", "resend_uncached": "re-send, cache off"}
_MODES = {"no_load": "no load", "load_interactive": "batch load, session in the interactive class",
          "load_batch_class": "batch load, session in the batch class"}


def format_sessions_table(rep: dict[str, Any]) -> str:
    m = rep["machine"]
    lines = [f"execstate sessions bench — {rep['model']}, fp32, {rep['threads']} threads; "
             f"{m['cpu_count']} CPUs ({m['cpu'] or '?'})"]
    for part, load in rep["loadavg_1m_before_part"].items():
        lines += ["", f"[{part}] 1-min load avg before: {load:.2f}"]
        lines += {"chat": _chat, "checkpoint": _checkpoint, "latency": _latency, "migration": _migration}[part](
            rep[part]
        )
    if m.get("loadavg_after"):
        lines += [
            "",
            f"machine: 1-min load avg before {m['loadavg_before'][0]:.2f}, after {m['loadavg_after'][0]:.2f}; "
            f"bench wall {rep['bench_seconds']:.0f} s; checks {'ok' if rep['ok'] else 'FAILED'}",
        ]
    return "\n".join(lines)


def _chat(c: dict[str, Any]) -> list[str]:
    w, p = c["workload"], c["paths"]
    names = list(p)

    def cols(vals: list[str]) -> str:
        return "".join(f"{v:>9}" for v in vals)

    short = cols(["session", "re+cache", "re-cache"][: len(names)])
    lines = [f"{w['turns']}-turn chat: {w['turn_len']} user tokens -> {w['max_tokens']} generated per turn, "
             f"{w['sampling']}; {w['repeats']} chats (medians); load before each chat "
             f"{span(c['loadavg_1m_before_repeat'], '.2f')}",
             "paths: session | " + " | ".join(_LABELS[n] for n in names[1:]) + " (LLM.generate of the whole history)",
             f"{'':>13} | {'prefill tokens computed':^27} | {'TTFT ms (call -> 1st token)':^27} | {'turn wall ms':^27}",
             f"{'turn':>4} {'context':>8} | {short} | {short} | {short}"]
    for k in range(w["turns"]):
        rows = [p[n]["turns"][k] for n in names]
        computed = cols([fmt(median(r["computed"]), ".0f") for r in rows])
        ttft = cols([fmt(r["ttft_ms"], ".1f") for r in rows])
        wall = cols([fmt(r["wall_ms"], ".0f") for r in rows])
        lines.append(f"{k + 1:>4} {rows[0]['prompt_tokens']:>8} | {computed} | {ttft} | {wall}")
    for n in names:
        e = p[n]
        lines.append(
            f"  {_LABELS[n]:<26} total {fmt(e['total_ms'], '.0f')} ms, prefill tokens "
            f"{fmt(median(e['total_computed']), '.0f')}, TTFT median over turns "
            f"{fmt(e['ttft_ms_median_over_turns'], '.1f')} ms, last turn {fmt(e['ttft_ms_last_turn'], '.1f')} ms "
            f"(engine-side, arrival -> first token: {fmt(e['turns'][-1]['engine_ttft_ms'], '.1f')} ms)"
        )
    lines.append(f"tokens identical across paths: {c['tokens_identical']} ({len(c['mismatches'])} mismatches over "
                 f"{c['compared_turns']} compared turns); session prefill per turn == turn_len, then turn_len + 1: "
                 f"{c['session_prefill_ok']}")
    return lines


def _checkpoint(c: dict[str, Any]) -> list[str]:
    lines = [
        f"checkpoint / rollback (median of {c['repeats']}) vs recomputing the state (median of "
        f"{c['recompute_repeats']}, prefix caching off)",
        f"{'context':>8} {'checkpoint ms':>14} {'rollback ms':>12} {'recompute ms':>13} {'speed-up':>10} {'load':>6}",
    ]
    for r in c["rows"]:
        lines.append(
            f"{r['context_tokens']:>8} {fmt(r['checkpoint_ms'], '.3f'):>14} {fmt(r['rollback_ms'], '.3f'):>12} "
            f"{fmt(r['recompute_ms'], '.0f'):>13} {fmt(r['restore_speedup'], ',.0f') + 'x':>10} "
            f"{r['loadavg_1m_before']:>6.2f}"
        )
    lines.append(f"targets: checkpoint < {c['checkpoint_target_ms']} ms at every length: "
                 f"{'ok' if c['checkpoint_ok'] else 'MISSED'}; restore >= {c['restore_speedup_target']:.0f}x "
                 f"recompute at the longest: {'ok' if c['restore_ok'] else 'MISSED'}")
    return lines


def _latency(c: dict[str, Any]) -> list[str]:
    w = c["workload"]
    lines = [f"interactive session step latency: {w['input_len']} new tokens -> {w['max_tokens']} generated; batch "
             f"load keeps max_num_seqs={w['max_num_seqs']} slots busy + {w['queued']} waiting "
             f"({w['batch_prompt_len']} prompt + {w['batch_max_tokens']} generated tokens each)",
             f"{'':<46} {'steps':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'batch reqs':>10} "
             f"{'load':>6}"]
    for mode, label in _MODES.items():
        r = c[mode]
        lines.append(f"{label:<46} {r['steps']:>5} {fmt(r['p50_ms'], '.0f'):>8} {fmt(r.get('p95_ms'), '.0f'):>8} "
                     f"{fmt(r['p99_ms'], '.0f'):>8} {fmt(r.get('max_ms'), '.0f'):>8} {r['batch_requests']:>10} "
                     f"{fmt(r.get('loadavg_1m_before'), '.2f'):>6}")
    return lines


def _migration(c: dict[str, Any]) -> list[str]:
    """Rows from ``measure_migration``'s keys (``sessions_migration_part``); missing ones show ``-``."""
    if not c["available"]:
        return [f"migration: {c['reason']}"]
    lines = ["migration of a live session between two engines (medians); its first step on the target "
             "(in place: the same step at the source)",
             f"{'context':>8} {'migrate ms':>11} {'1st step ms (in place)':>23} {'recompute ms':>13} "
             f"{'migrate/recompute':>18} {'tokens equal':>13} {'load':>6}  "
             "failure (injected) -> detected / served again at the source, ms"]
    for r in c["results"]:
        if "error" in r:
            lines.append(f"{r['context_tokens']:>8} error: {r['error']}")
            continue
        fails = r.get("failure_recovery") or {}
        fail_text = "; ".join(f"{mode}: {f.get('error')} {_ms(f.get('detect_s'))} / {_ms(f.get('recovery_s'))}"
                              for mode, f in fails.items()) or "-"
        step = f"{_ms(r.get('first_step_s'))} ({_ms(r.get('in_place_step_s'))})"
        lines.append(f"{r['context_tokens']:>8} {_ms(r.get('migrate_s')):>11} {step:>23} "
                     f"{_ms(r.get('recompute_s')):>13} {fmt(r.get('state_recovery_overhead'), '.3f'):>18} "
                     f"{str(r.get('tokens_equal', '-')):>13} {r['loadavg_1m_before']:>6.2f}  {fail_text}")
    return lines


def _ms(seconds: float | None) -> str:
    return fmt(None if seconds is None else seconds * 1e3, ".1f")
