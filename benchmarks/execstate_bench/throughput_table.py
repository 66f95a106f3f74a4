"""The text table of a throughput report (``execstate bench throughput`` prints it)."""

from __future__ import annotations

import statistics
from typing import Any

from execstate_bench.numbers import fmt, median, span
from execstate_bench.throughput_report import CLEAN_SHARE


def _clean(b: dict[str, Any] | None) -> str:
    if not b:
        return "n/a"
    return f"{fmt(b['clean_median_tok_s'], '.1f')} ({b['clean_runs']}/{len(b['tok_s'])})"


def format_table(report: dict[str, Any]) -> str:
    """The report of ``run_throughput_bench`` as text: a row per peer, then ratios, start-up,
    parity, warnings, the machine and its noise, and the notes."""
    wl = report["workload"]
    lines = [
        f"execstate throughput — model {report['model']} ({report['architecture']}, "
        f"{report['param_count'] / 1e6:.1f}M params), fp32, {report['threads']} threads, "
        f"median of {report['repeats']} interleaved repeats",
        f"workload: batch 8 = {wl['num_prompts']} prompts x {wl['prompt_len']} tokens -> "
        f"{wl['max_new_tokens']} new tokens each, greedy, ignore_eos; batch 1 = {wl['batch1_prompts']} "
        f"prompts one at a time (tok/s = generated tokens / wall s, prefill included); b8 prefill tok/s = "
        f"{wl['num_prompts']} x {wl['prompt_len']} prompt tokens / the wall time of a max_tokens=1 run of the "
        f"batch's prompts (nothing cached; vLLM's peer probes the same way)",
        "",
        f"{'peer':<52}{'batch 8 tok/s':>14}{'batch 1 tok/s':>15}{'b8 clean (n)':>14}{'b1 clean (n)':>14}"
        f"{'b1 TTFT s':>11}{'b1 decode tok/s':>17}{'b8 prefill tok/s':>18}  runs (b8 | b1)",
    ]
    for name, e in report["peers"].items():
        if not e.get("available"):
            lines.append(f"{name:<52}{e['note']}")
            continue
        b8, b1 = e.get("batch8"), e.get("batch1")
        runs8 = " ".join(fmt(x, ".1f") for x in b8["tok_s"]) if b8 else "n/a"
        runs1 = " ".join(fmt(x, ".1f") for x in b1["tok_s"]) if b1 else "n/a"
        exact = all(b is None or b["tokens_exact"] for b in (b8, b1))
        lines.append(
            f"{e['label']:<52}{fmt(b8['median_tok_s'], '.1f') if b8 else 'n/a':>14}"
            f"{fmt(b1['median_tok_s'], '.1f') if b1 else 'n/a':>15}"
            f"{_clean(b8):>14}{_clean(b1):>14}"
            f"{fmt(b1.get('median_ttft_s') if b1 else None, '.3f'):>11}"
            f"{fmt(b1.get('decode_tok_s') if b1 else None, '.1f'):>17}"
            f"{fmt(b8.get('prefill_tok_s') if b8 else None, '.0f'):>18}  {runs8} | {runs1}"
            + ("" if exact else "  TOKEN COUNT MISMATCH")
        )
    lines.append("")
    for name, pp in report.get("prefill_pairs", {}).items():
        lines.append(f"prefill pairs {name}: peer s / engine s median {pp['median_ratio']:.3f} "
                     f"(min {pp['min_ratio']:.3f}, max {pp['max_ratio']:.3f}) over {len(pp['ratios'])} pairs, "
                     f"engine first in even pairs")
    r3 = report["ratios"]["r3_overhead"]
    for key in ("batch8", "batch1"):
        x = r3[key]
        lines.append(f"R3 overhead {key}: on/off = {fmt(x['on_over_off'], '.3f')} "
                     f"({fmt(x['slowdown_pct'], '+.1f')}% slowdown; paired median "
                     f"{fmt(x['paired_median'], '.3f')}); clean runs only: "
                     f"{fmt(x['clean_on_over_off'], '.3f')} ({fmt(x['clean_slowdown_pct'], '+.1f')}%); "
                     f"direct (R3 bookkeeping time in the R3-on engine / its wall time): "
                     f"{fmt(x.get('direct_pct'), '.2f')}%")
    for peer in ("transformers", "llama_cpp", "vllm"):
        rr = report["ratios"].get(f"engine_over_{peer}")
        if rr:
            parts = [f"{k} {fmt(v['r3_off'], '.2f')}x (R3 on {fmt(v['r3_on'], '.2f')}x; clean runs "
                     f"{fmt(v['clean_r3_off'], '.2f')}x / {fmt(v['clean_r3_on'], '.2f')}x)" for k, v in rr.items()]
            lines.append(f"engine / {peer}: " + ", ".join(parts))
    bf16 = report["ratios"].get("bf16_over_fp32")
    if bf16:
        lines.append("engine bf16 weights / fp32: " + ", ".join(
            f"{k} {fmt(v['r3_off'], '.2f')}x (clean runs {fmt(v['clean_r3_off'], '.2f')}x)" for k, v in bf16.items()))
    for pair, figs in report["ratios"].get("modes", {}).items():
        lines.append(f"{pair}: " + ", ".join(f"{k} {fmt(v, '.2f')}x" for k, v in figs.items()))
    st = report["engine_startup_seconds"]
    lines.append("engine start: " + ", ".join(f"{k} {v:.2f} s" for k, v in st.items())
                 + f" (target < {report['engine_startup_target_seconds']:.0f} s: "
                 + ("ok" if report["engine_startup_ok"] else "MISSED") + ")")
    for name, per in report["parity"].items():
        parts = [f"{k} {c['identical']}/{c['tokens']} tokens ({100 * (c['identical_fraction'] or 0):.1f}%), "
                 f"{c['sequences_identical']}/{c['sequences']} sequences identical, first divergence at "
                 f"{c.get('first_divergence')}" for k, c in per.items()]
        ref = report["peers"].get(name, {}).get("parity_reference", "execstate_r3_on")
        lines.append(f"greedy parity vs {ref}, {name}: " + "; ".join(parts))
    for p in [n for n in report["peers"] if n.startswith("execstate")]:
        e = report["peers"][p]
        if e.get("prefix_cache_hit_tokens"):
            lines.append(f"WARNING {p}: {e['prefix_cache_hit_tokens']} prefix-cache hit tokens in timed runs")
        if e.get("routed_experts_shape_ok") is False:
            lines.append(f"WARNING {p}: routed_experts shape mismatch")
    for vname in ("vllm", "vllm_bf16"):
        vl = report["peers"].get(vname, {})
        if not vl.get("available"):
            continue
        lines.append(f"{vname}: engine start {fmt(median(vl['startup_seconds']), '.1f')} s, batched prefill "
                     f"{fmt(vl.get('prefill_batched_tok_s'), '.0f')} tok/s (max_tokens=1 runs of the batch-8 "
                     f"prompts), settings {vl.get('settings')}")
    hf = report["peers"].get("transformers", {})
    if hf.get("experts_implementation"):
        lines.append(f"transformers experts implementation: {hf['experts_implementation']}")
    m = report["machine"]
    lines.append(f"machine: {m['processor']}, {m['cpu_count']} CPUs, torch {m['torch']}, "
                 f"load avg after {tuple(round(x, 2) for x in m['loadavg_after'] or ())}; "
                 f"bench wall {report['bench_seconds']:.0f} s")
    shares = [x for e in report["peers"].values() if e.get("available")
              for k in ("batch8", "batch1") if e.get(k) for x in e[k]["cpu_share"]]
    loads = [x for e in report["peers"].values() if e.get("available")
             for k in ("batch8", "batch1") if e.get(k) for x in e[k]["loadavg_1m_before"]]
    if shares:
        lines.append(f"noise: CPU share of this process per run (CPU s / wall s / threads) "
                     f"min {min(shares):.2f} median {statistics.median(shares):.2f}; 1-min load avg before runs "
                     f"{span(loads)}; clean runs = share >= {CLEAN_SHARE}")
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
