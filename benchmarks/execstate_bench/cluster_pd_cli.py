"""The ``execstate bench cluster-pd`` sub-command (arguments and run; the heavy imports happen when
it runs): a PD fleet against a plain fleet of as many replicas (``cluster_pd.py``)."""

from __future__ import annotations

import argparse
import json


def add_cluster_pd_parser(bsub: argparse._SubParsersAction) -> None:
    bp = bsub.add_parser("cluster-pd", help="a PD fleet (P prefill + D decode replicas) against a plain fleet of P+D "
                                            "replicas on Ray Serve: TTFT and throughput (needs the fleet extra)")
    bp.add_argument("--model", default="tiny", help="'tiny' (the tests' tiny MoE, 4096 positions), 'standard', an "
                                                    "embedded name or a path")
    bp.add_argument("--pd", default="1,1", help="prefill and decode replicas of the PD fleet, P,D")
    bp.add_argument("--rounds", type=int, default=1, help="plain and PD runs, alternated, this many times each")
    bp.add_argument("--users", type=int, default=16)
    bp.add_argument("--systems", type=int, default=4, help="distinct system prompts")
    bp.add_argument("--system-len", type=int, default=512, help="tokens per system prompt")
    bp.add_argument("--turns", type=int, default=3)
    bp.add_argument("--user-len", type=int, default=64, help="tokens per user turn")
    bp.add_argument("--reply-len", type=int, default=16, help="tokens per reply")
    bp.add_argument("--concurrency", type=int, default=4, help="users in flight at once")
    bp.add_argument("--kv-blocks", type=int, default=384, help="KV blocks per replica (16 tokens each); 0: the "
                                                               "engine's default")
    bp.add_argument("--out", default=None, help="write the report (JSON) here")
    bp.add_argument("--json", action="store_true")


def run_cluster_pd_cli(args: argparse.Namespace) -> int:
    from execstate_bench.cluster_pd import format_cluster_pd_table, run_cluster_pd_bench
    from execstate_bench.cluster_workload import ClusterWorkload

    p, _, d = args.pd.partition(",")
    w = ClusterWorkload(users=args.users, systems=args.systems, system_len=args.system_len, turns=args.turns,
                        user_len=args.user_len, reply_len=args.reply_len, session_users=0,
                        concurrency=args.concurrency)
    report = run_cluster_pd_bench(model=args.model, pd=(int(p), int(d)), workload=w, rounds=args.rounds,
                                  kv_blocks=args.kv_blocks or None)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2) if args.json else format_cluster_pd_table(report))
    return 0 if all(r["errors"] == 0 for r in report["runs"]) else 1
