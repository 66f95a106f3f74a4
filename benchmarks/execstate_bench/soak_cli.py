"""The ``execstate bench soak`` sub-command (arguments and run; ``soak.py`` does the work)."""

from __future__ import annotations

import argparse
import json


def add_soak_parser(bsub: argparse._SubParsersAction) -> None:
    b = bsub.add_parser("soak", help="a server kept busy on every surface with injected faults for N minutes: RSS, "
                                     "fds, threads, blocks, tier units, sessions, p50/p99 per surface, errors "
                                     "over time; leaked blocks and unexpected 5xx at the end")
    b.add_argument("--minutes", type=float, default=2.0, help="how long (default: %(default)s)")
    b.add_argument("--clients", type=int, default=5, help="concurrent client loops (default: %(default)s)")
    b.add_argument("--period", type=float, default=None,
                   help="seconds between samples (default: the run over 120 samples, at least 2 s)")
    b.add_argument("--threads", type=int, default=2, help="the server's torch threads (default: %(default)s)")
    b.add_argument("--skip", default="", help="operations to leave out, comma-separated (e.g. voice: which "
                                               "surface a trend comes from) (default: none)")
    b.add_argument("--max-rss-mb", type=float, default=6000.0,
                   help="stop early when the server's RSS passes this (a shared machine's memory; the report "
                        "says so); with --ray, the fleet's processes together may hold replicas + 1 times it "
                        "(default: %(default)s)")
    b.add_argument("--ray", action="store_true",
                   help="soak a Ray Serve fleet (execstate serve MODEL --ray) instead of one server, with a replica "
                        "SIGKILLed mid-load and a rolling weight update among the faults (default: one server)")
    b.add_argument("--replicas", type=int, default=2, help="with --ray: the fleet's engine replicas "
                                                           "(default: %(default)s)")
    b.add_argument("--out", default=None, help="write the report (JSON) here")
    b.add_argument("--png", default=None, help="write the plot over time (PNG) here")


def run_soak_cli(args: argparse.Namespace) -> int:
    from execstate_bench.soak import run_soak
    from execstate_bench.soak_plot import plot_soak

    skip = tuple(s for s in args.skip.split(",") if s)
    if args.ray:
        from execstate_bench.soak_ray import run_ray_soak

        report = run_ray_soak(args.minutes, args.clients, args.replicas, args.period, args.threads, skip,
                              args.max_rss_mb * (args.replicas + 1))
    else:
        report = run_soak(args.minutes, args.clients, args.period, args.threads, skip, args.max_rss_mb)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if args.png:
        plot_soak(report, args.png)
    v = report["verdict"]
    print(json.dumps({"operations": report["operations"], "faults": [w["fault"] for w in report["faults"]],
                      "verdict": {k: v[k] for k in ("rss", "fds", "threads", "leaked_blocks", "met")},
                      "unexpected_5xx": v["unexpected_5xx"]["count"],
                      "p99_trend_met": v["p99_trend"]["met"],
                      **({"fleet": {k: report["fleet"][k] for k in ("errors", "probe", "resumed_total")}}
                         if args.ray else {})}, indent=1))
    return 0 if v["met"] else 1
