"""The table and the PNG of ``execstate bench cluster`` (``cluster.py``'s report): TTFT p50/p99,
throughput, prefix hit rate and requests per replica for each (replicas, router) run; the plot is
TTFT p50 (and p99, dashed) vs replicas, one line per router (the 1-replica run is every router's
first point)."""

from __future__ import annotations

from typing import Any

_COLORS = {"round_robin": "#7f7f7f", "power_of_two": "#1f77b4", "text_prefix": "#ff7f0e", "execstate": "#2ca02c"}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def format_cluster_table(report: dict[str, Any]) -> str:
    w = report["workload"]
    out = [f"model {report['model']}; {w['users']} users ({w['session_users']} as sessions) x {w['turns']} turns, "
           f"{w['systems']} system prompts of {w['system_len']} tokens, turns of {w['user_len']}, replies of "
           f"{w['reply_len']}, {w['concurrency']} concurrent users; load {report['load_before']} -> "
           f"{report.get('load_after')}; {report['kv_blocks_per_replica']} KV blocks of {report['block_size']} tokens "
           "per replica",
           f"{'replicas':>8} {'router':<13} {'TTFT p50':>9} {'p99':>7} {'tok/s':>7} {'req/s':>6} {'hit rate':>8} "
           f"{'computed':>9} {'errors':>6}  requests per replica"]
    for r in report["runs"] + ([report["kill"]] if report.get("kill") else []):
        load = " ".join(str(p["requests"]) for p in r["per_replica"].values())
        out.append(f"{r['replicas']:>8} {r['router']:<13} {_ms(r['ttft_p50_ms']):>9} {_ms(r['ttft_p99_ms']):>7} "
                   f"{r['tokens_per_s']:>7.1f} {r['requests_per_s']:>6.2f} {r['prefix_hit_rate']:>8.1%} "
                   f"{r['prompt_tokens_computed']:>9} {r['errors']:>6}  {load}"
                   + ("  (a replica SIGKILLed)" if "kill" in r else ""))
    k = report.get("kill", {}).get("kill")
    if k:
        out.append(f"kill: replica SIGKILLed at {k['at_s']:.1f} s; {k['failed']} requests failed "
                   f"({k['failed_mid_stream']} mid-stream), {k['started_after_kill_ok']} started after it succeeded, "
                   f"first success {_ms((k['first_success_after_kill_s'] or 0) * 1000)} ms after, replacement "
                   f"registered after {k['replacement_registered_s']:.1f} s")
    return "\n".join(out)


def plot_cluster(report: dict[str, Any], path: str) -> None:
    """Left: TTFT p50 (solid) and p99 (dashed) vs replicas per router, labelled with the prefix hit
    rate; right: the prompt tokens the engines computed (the work the routing caused)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one = [r for r in report["runs"] if r["replicas"] == 1]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for router, color in _COLORS.items():
        runs = sorted(one + [r for r in report["runs"] if r["router"] == router], key=lambda r: r["replicas"])
        if len(runs) <= len(one):
            continue
        xs = [r["replicas"] for r in runs]
        ax.plot(xs, [r["ttft_p50_ms"] for r in runs], "o-", color=color, label=f"{router} p50")
        ax.plot(xs, [r["ttft_p99_ms"] for r in runs], "x--", color=color, alpha=0.5, label=f"{router} p99")
        for r in runs[len(one):]:
            ax.annotate(f"{r['prefix_hit_rate']:.0%}", (r["replicas"], r["ttft_p50_ms"]), fontsize=7, color=color,
                        textcoords="offset points", xytext=(6, -3))
        ax2.plot(xs, [r["prompt_tokens_computed"] / 1000 for r in runs], "o-", color=color, label=router)
    replicas = sorted({r["replicas"] for r in report["runs"]})
    ax.set_yscale("log")
    ax.set_xticks(replicas)
    ax.set_xlabel("engine replicas")
    ax.set_ylabel("TTFT (ms, log scale)")
    w = report["workload"]
    ax.set_title(f"TTFT vs replicas per router (labels: prefix hit rate)\n{w['users'] * w['turns']} requests, "
                 f"load {report['load_before'][0]:.0f}-{(report.get('load_after') or [0])[0]:.0f} on "
                 f"{report['cpus']} shared cores", fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    ax2.set_xticks(replicas)
    ax2.set_xlabel("engine replicas")
    ax2.set_ylabel("prompt tokens computed (thousands)")
    ax2.set_ylim(bottom=0)
    ax2.set_title("prefill work the routing caused (looked up - cache hits)", fontsize=9)
    ax2.legend(fontsize=7)
    fig.suptitle(f"execstate fleet on Ray Serve ({report['model']} model, {report['kv_blocks_per_replica']} KV "
                 f"blocks per replica)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
