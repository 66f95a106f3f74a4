"""The text table of a PD bench report (``execstate bench pd`` prints it)."""

from __future__ import annotations

from typing import Any

from execstate_bench.numbers import fmt, span


def format_table(rep: dict[str, Any]) -> str:
    """The report of ``run_pd_bench`` as text: TTFT and tok/s per path, ratios, transfer,
    TTFT breakdown, correctness, the failure checks, the machine and the processes' CPU."""
    wl, t, b, rc = rep["workload"], rep["transfer"], rep["breakdown"], rep["recovery"]
    ra = rep["ratios"]
    lines = [
        f"execstate PD bench — {rep['model']} ({rep['architecture']}, {rep['n_moe_layers']} MoE layers, "
        f"top-{rep['top_k']}), fp32, {rep['threads']} threads per engine process",
        f"workload: {wl['num_prompts']} prompts x {wl['prompt_len']} tokens -> {wl['max_tokens']} tokens, greedy, "
        f"one at a time, streamed; {wl['repeats']} repeats, fresh prompts per repeat; startup {rep['startup_s']:.1f} s",
        "",
        f"{'path':<28}{'TTFT s (median)':>16}{'tok/s (median)':>16}  TTFT per request",
    ]
    for name, label in (("single", "single instance"), ("pd", "PD (proxy -> P -> D)")):
        e = rep["paths"][name]
        lines.append(f"{label:<28}{fmt(e['median_ttft_s']):>16}{fmt(e['median_tok_s'], '.2f'):>16}  "
                     + " ".join(fmt(x, ".2f") for x in e["ttft_s"]))
    lines += [
        f"TTFT PD / single: {fmt(ra['ttft_pd_over_single'])} (paired median {fmt(ra['ttft_paired_median'])}; "
        f"target <= {ra['ttft_target']}: {'ok' if ra['ttft_ok'] else 'MISSED'}); "
        f"tok/s PD / single: {fmt(ra['tok_s_pd_over_single'])}",
        f"transfer per request: KV {fmt(t['kv_bytes_per_request'], ',.0f')} B, control "
        f"{fmt(t['control_bytes_per_request'], ',.0f')} B, routes {fmt(t['route_bytes_per_request'], ',.0f')} B "
        f"({t['route_bytes_per_token']} B x {fmt(t['transferred_tokens_per_request'], '.0f')} tokens; inside control)",
        f"(route + control) / KV = {fmt(t['route_plus_control_over_kv'], '.4%')} (control / KV "
        f"{fmt(t['control_over_kv'], '.4%')}; target < {t['overhead_target']:.0%}: "
        f"{'ok' if t['overhead_ok'] else 'MISSED'}); transfers {t['transfers']:.0f}, failures {t['failures']:.0f}",
        f"effective bandwidth: {fmt((t['bandwidth_bytes_per_s'] or 0) / 1e9, '.2f')} GB/s "
        f"({fmt(t['transfer_seconds_per_request'])} s per transfer, incl. handshake check, manifest, read, checksums)",
        f"PD TTFT breakdown (medians): P server {fmt(b['prefill_server_ttft_s'])} s (prefill + export), D server "
        f"{fmt(b['decode_server_ttft_s'])} s (of which transfer {fmt(b['decode_transfer_s'])} s), HTTP + proxy "
        f"{fmt(b['http_and_proxy_s'])} s; single: server {fmt(b['single_server_ttft_s'])} s, HTTP "
        f"{fmt(b['single_http_s'])} s; sha256 {fmt(b['sha256_bytes_per_s'] / 1e9, '.2f')} GB/s -> ~"
        f"{fmt(b['checksum_s_per_side_estimate'])} s checksums per side",
        f"correctness: {rep['correctness']['token_mismatches']} token mismatches over "
        f"{rep['correctness']['compared']} prompts (PD vs single); prefix-hit tokens single "
        f"{rep['paths']['single']['prefix_hit_tokens']}, PD {rep['paths']['pd']['prefix_hit_tokens']}",
    ]
    f = rc["failure"]
    lines.append(f"injected corrupt (policy fail): error {'detected' if f['error_detected'] else 'NOT DETECTED'} "
                 f"after {fmt(f['detect_s'])} s (status {f['status']}; "
                 f"D failures +{f['decode_transfer_failures']:.0f}; "
                 f"D healthy after: {f['faulty_decode_healthy_after']}); recovery (error -> retry served via the "
                 f"healthy path) {fmt(rc['recovery_s'])} s, to first token {fmt(rc['recovery_first_token_s'])} s, "
                 f"injection -> served {fmt(rc['injection_to_served_s'])} s")
    r = rc["recompute"]
    lines.append(f"injected corrupt (policy recompute): {'ok' if r['ok'] else 'FAILED'}, tokens equal single: "
                 f"{r['tokens_equal_single']}, TTFT {fmt(r['ttft_s'])} s (single {fmt(r['single_ttft_s'])} s), "
                 f"sources {r['prompt_token_sources']}")
    m = rep.get("machine")
    if m:
        loads = [x["loadavg_1m_before"] for p in rep["paths"].values() for x in p["runs"]]
        lines.append(f"machine: {m['cpu_count']} CPUs; 1-min load avg before {m['loadavg_before'][0]:.1f}, "
                     f"during runs {span(loads)}, after {m['loadavg_after'][0]:.1f}; "
                     f"bench wall {rep['bench_seconds']:.0f} s")
    if rep.get("idle_profile"):
        lines.append("idle CPU cores per process before timing: " + ", ".join(
            f"{k} {v['cores']:.2f} (busy threads {len(v['busy_threads'])})" for k, v in rep["idle_profile"].items())
            + ("; reniced to 19: " + str(rep["niced_threads"]) if rep.get("niced_threads") else ""))
    if rep.get("cpu_seconds_timed_phase"):
        lines.append("CPU s per process over the timed phase: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in rep["cpu_seconds_timed_phase"].items()))
    return "\n".join(lines)
