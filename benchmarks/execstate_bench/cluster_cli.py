"""The ``execstate bench cluster`` sub-command (arguments and run; the heavy imports happen when it
runs): the fleet on Ray Serve under a shared-prefix multi-turn workload (``cluster.py``)."""

from __future__ import annotations

import argparse
import json

ROUTERS = "round_robin,power_of_two,text_prefix,execstate"


def add_cluster_parser(bsub: argparse._SubParsersAction) -> None:
    bc = bsub.add_parser("cluster", help="the fleet on Ray Serve: TTFT, throughput, prefix hit rate and load per "
                                         "replica for each replica count and router (needs the fleet extra)")
    bc.add_argument("--model", default="tiny", help="'tiny' (the tests' tiny MoE, 4096 positions), 'standard', an "
                                                    "embedded name or a path")
    bc.add_argument("--replicas", default="1,2,3", help="replica counts, comma-separated")
    bc.add_argument("--routers", default=ROUTERS, help="routers (fleet policies), comma-separated")
    bc.add_argument("--users", type=int, default=32)
    bc.add_argument("--session-users", type=int, default=2, help="of the users, how many chat through sessions")
    bc.add_argument("--systems", type=int, default=8, help="distinct system prompts")
    bc.add_argument("--system-len", type=int, default=1024, help="tokens per system prompt")
    bc.add_argument("--turns", type=int, default=4)
    bc.add_argument("--user-len", type=int, default=64, help="tokens per user turn")
    bc.add_argument("--reply-len", type=int, default=16, help="tokens per reply")
    bc.add_argument("--concurrency", type=int, default=6, help="users in flight at once")
    bc.add_argument("--tenants", type=int, default=1,
                    help="tenants (API keys) the users call as; every system prompt is used by every tenant, and "
                         "each tenant's prefix cache is its own")
    bc.add_argument("--share-tenants", action="store_true",
                    help="put every tenant in one --shared-prefix-group (their caches shared, as one tenant)")
    bc.add_argument("--kv-blocks", type=int, default=384,
                    help="KV blocks per replica (16 tokens each): fewer than every system prompt needs, so the "
                         "fleet's aggregate cache matters; 0: the engine's default")
    bc.add_argument("--kill", action="store_true",
                    help="also: a run of execstate's router at the largest replica count that SIGKILLs a replica")
    bc.add_argument("--kill-after", type=float, default=0.3,
                    help="with --kill: the fraction of the requests finished when the replica is killed")
    bc.add_argument("--scenario", choices=("routers", "sessions"), default="routers",
                    help="'routers': the workload for each replica count and router; 'sessions': live sessions "
                         "through a drain and a SIGKILL on one timeline (a redis-server as the shared tier; "
                         "--replicas' largest count, --live-sessions) (default: %(default)s)")
    bc.add_argument("--live-sessions", type=int, default=10,
                    help="--scenario sessions: the sessions the drained replica holds (default: %(default)s)")
    bc.add_argument("--png", default=None, help="write the plot (TTFT vs replicas per router; --scenario sessions: "
                                                "the timeline of the drain and the kill) here")
    bc.add_argument("--out", default=None, help="write the report (JSON) here")
    bc.add_argument("--json", action="store_true")


def run_cluster_cli(args: argparse.Namespace) -> int:
    if args.scenario == "sessions":
        return _run_sessions(args)
    from execstate_bench.cluster import run_cluster_bench
    from execstate_bench.cluster_report import format_cluster_table, plot_cluster
    from execstate_bench.cluster_workload import ClusterWorkload

    w = ClusterWorkload(users=args.users, systems=args.systems, system_len=args.system_len, turns=args.turns,
                        user_len=args.user_len, reply_len=args.reply_len, session_users=args.session_users,
                        concurrency=args.concurrency, tenants=args.tenants, share_tenants=args.share_tenants)
    report = run_cluster_bench(model=args.model, replicas=tuple(int(n) for n in args.replicas.split(",")),
                               routers=tuple(args.routers.split(",")), workload=w, kill=args.kill,
                               kill_after=args.kill_after,
                               kv_blocks=args.kv_blocks or None)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    if args.png:
        plot_cluster(report, args.png)
    print(json.dumps(report, indent=2) if args.json else format_cluster_table(report))
    return 0 if all(r["errors"] == 0 for r in report["runs"]) else 1


def _run_sessions(args: argparse.Namespace) -> int:
    from execstate_bench.cluster_sessions import SessionsScenario, run_sessions_bench
    from execstate_bench.cluster_timeline import format_sessions_table, plot_timeline

    sc = SessionsScenario(replicas=max(3, max(int(n) for n in args.replicas.split(","))),
                          live_sessions=args.live_sessions)
    report = run_sessions_bench(args.model, sc)
    if args.out:
        with open(args.out, "w") as f:  # compact: every step of the run is in its timeline
            json.dump(report, f, separators=(",", ":"))
    if args.png:
        plot_timeline(report, args.png)
    print(json.dumps(report, indent=2) if args.json else format_sessions_table(report))
    return 0 if report["drain"]["lost"] == 0 and report["kill"]["lost"] == 0 else 1
