"""Command line: ``execstate models|bench|demo|serve|proxy|world ...`` (heavy imports happen per command)."""

from __future__ import annotations

import argparse
import json
import math
import sys


def _models(args: argparse.Namespace) -> int:
    if args.models_cmd == "list":
        from execstate.model.random_models import ARCHITECTURES
        from execstate.model.registry import list_models

        for m in list_models():
            state = "prepared" if m["prepared"] else "not prepared"
            print(f"{m['name']:<16} {state:<13} {m['description']}")
        print(f"random tiny architectures (make-random): {', '.join(ARCHITECTURES)}, standard")
        return 0
    if args.models_cmd == "prepare":
        from execstate.model.registry import prepare

        print(prepare(args.name, force=args.force))
        return 0
    if args.models_cmd == "make-random":
        from execstate.model.random_models import ARCHITECTURES, make_random, make_standard_moe

        if args.arch == "standard":
            print(make_standard_moe(args.out, seed=args.seed))
        elif args.arch in ARCHITECTURES:
            print(make_random(args.arch, args.out, seed=args.seed))
        else:
            print(f"unknown architecture {args.arch!r}; choose from {', '.join(ARCHITECTURES)}, standard", file=sys.stderr)
            return 2
        return 0
    raise AssertionError(args.models_cmd)


def _bench(args: argparse.Namespace) -> int:
    if args.bench_cmd == "throughput":
        from execstate.bench.throughput import run_throughput_bench

        report = run_throughput_bench(
            model=args.model, repeats=args.repeats, peers=not args.no_peers, num_threads=args.threads
        )
        if args.json:
            print(json.dumps(report, indent=2))
        return 0
    if args.bench_cmd == "pd" and args.itl_under_loads:
        from execstate.bench.pd_itl import format_itl_table, run_itl_under_loads

        report = run_itl_under_loads(model=args.model, prompt_len=args.prompt_len, num_loads=args.num_loads,
                                     threads=args.threads)
        print(json.dumps(report, indent=2) if args.json else format_itl_table(report))
        return 0
    if args.bench_cmd == "pd":
        from execstate.bench.pd import run_pd_bench

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
        from execstate.bench.kernels import format_kernel_table, run_kernel_bench

        report = run_kernel_bench(repeats=args.repeats, threads=args.threads)
        print(json.dumps(report, indent=2) if args.json else format_kernel_table(report))
        return 0
    if args.bench_cmd == "sampler":
        from execstate.bench.sampler import format_sampler_table, run_sampler_bench

        report = run_sampler_bench(repeats=args.repeats, threads=args.threads)
        print(json.dumps(report, indent=2) if args.json else format_sampler_table(report))
        return 0
    if args.bench_cmd == "weights":
        from execstate.bench.weights import run_weights_bench

        report = run_weights_bench(model=args.model, repeats=args.repeats, threads=args.threads,
                                   print_table=not args.json)
        if args.json:
            print(json.dumps(report, indent=2))
        return 0
    if args.bench_cmd == "load":
        from execstate.bench.load import format_load_report, run_load_bench

        report = run_load_bench(
            model=args.model, clients=args.clients, rounds=args.rounds, prompt_len=args.prompt_len,
            max_tokens=args.max_tokens, cut_every=args.cut_every, cut_after=args.cut_after, flood=args.flood,
            max_num_seqs=args.max_num_seqs, max_waiting=args.max_waiting_requests, threads=args.threads,
        )
        print(json.dumps(report, indent=2) if args.json else format_load_report(report))
        return 0 if report["ok"] else 1
    if args.bench_cmd == "itl":
        from execstate.bench.itl import format_itl_table, run_itl_bench

        report = run_itl_bench(max_tokens=args.max_tokens, kinds=args.kinds.split(","), logprobs=args.logprobs,
                               window=args.window, threads=args.threads, model=not args.no_model,
                               repeats=args.repeats)
        print(json.dumps(report, indent=2) if args.json else format_itl_table(report))
        return 0
    if args.bench_cmd == "sessions":
        from execstate.bench.sessions import run_sessions_bench
        from execstate.bench.sessions_table import format_sessions_table

        report = run_sessions_bench(
            model=args.model, parts=tuple(args.parts.split(",")), turns=args.turns, turn_len=args.turn_len,
            max_tokens=args.max_tokens, chat_repeats=args.repeats,
            contexts=tuple(int(n) for n in args.contexts.split(",")), steps=args.steps,
            batch_class_steps=args.batch_class_steps, threads=args.threads,
        )
        print(json.dumps(report, indent=2) if args.json else format_sessions_table(report))
        return 0 if report["ok"] else 1
    if args.bench_cmd == "duplex":
        from execstate.bench.duplex import format_duplex_table, run_duplex_bench

        report = run_duplex_bench(
            model=args.model, parts=tuple(args.parts.split(",")), conversations=args.conversations, turns=args.turns,
            policies=tuple(_policy(x) for x in args.policies.split(",")), step_tokens=args.step_tokens,
            load_tasks=args.load_tasks, threads=args.threads, seed=args.seed, png=args.png)
        print(json.dumps(report, indent=2) if args.json else format_duplex_table(report))
        return 0
    if args.bench_cmd == "world":
        from execstate.bench.world import run_world_bench
        from execstate.bench.world_table import format_world_table

        report = run_world_bench(model=args.model, parts=tuple(args.parts.split(",")), steps=args.steps,
                                 memory_steps=args.memory_steps, compiled_steps=args.compiled_steps,
                                 episodes=args.episodes, threads=args.threads, png=args.png)
        print(json.dumps(report, indent=2) if args.json else format_world_table(report))
        return 0
    raise AssertionError(args.bench_cmd)


def _policy(spec: str) -> tuple[float, float | None]:
    silence, _, final = spec.partition(":")
    return float(silence), None if final in ("", "none") else float(final)


def _demo(args: argparse.Namespace) -> int:
    from execstate.demo import run_demo

    return run_demo(model=args.model)


def _proxy(args: argparse.Namespace) -> int:
    from execstate.serve.proxy import run_proxy

    return run_proxy(args)


def _serve(args: argparse.Namespace) -> int:
    from execstate.serve.server import run_server

    if args.model is None and args.world is None:
        raise SystemExit("execstate serve: give a MODEL, --world, or both")

    return run_server(args)


def _size(text: str) -> int:
    from execstate.serve.limits import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# Defaults of the engine's capacity options (EngineConfig's; tests/serve/test_limits.py checks
# they agree; engine.config imports torch, which --help should not wait for).
_ENGINE_DEFAULTS = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "kv_cache_memory": 1 << 30}

# Defaults of the session options (EngineConfig's; tests/session/test_session_options.py checks them).
_SESSION_DEFAULTS = {"max_sessions": 64, "session_eviction": "none", "max_session_events": 64}

_LIMIT_HELP = {
    "max_n": "most choices per prompt (n)",
    "max_logprobs": "most logprobs (completions) / top_logprobs (chat) per token",
    "max_prompts_per_request": "most prompts in one /v1/completions request",
    "max_stop_strings": "most stop strings per request",
    "max_stop_string_length": "most characters in one stop string",
    "max_stop_token_ids": "most stop_token_ids per request",
    "max_request_bytes": "largest HTTP request body (bytes, or a size such as 4MiB); larger gets 413",
    "max_waiting_requests": "engine requests (prompts x n) that may wait to be scheduled; beyond it, "
                            "429 with Retry-After",
}


def _add_capacity_and_limit_options(s: argparse.ArgumentParser) -> None:
    """``serve``: the engine's capacity and the bounds on each request (``ServingLimits``)."""
    from execstate.serve.limits import ServingLimits, option_name

    e = _ENGINE_DEFAULTS
    g = s.add_argument_group("engine capacity")
    g.add_argument("--max-num-seqs", type=int, default=e["max_num_seqs"],
                   help="requests running at once (default: %(default)s)")
    g.add_argument("--max-num-batched-tokens", type=int, default=e["max_num_batched_tokens"],
                   help="tokens per engine step, shared by decodes and chunked prefills (default: %(default)s)")
    g.add_argument("--kv-cache-memory", type=_size, default=e["kv_cache_memory"],
                   help="memory of the KV block pool: bytes or a size such as 512MiB, 2GiB "
                        "(default: %(default)s bytes = 1GiB; the pool never exceeds what --max-num-seqs "
                        "full-length sequences can use)")
    g.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV pool size in blocks; overrides --kv-cache-memory (default: from --kv-cache-memory)")
    g = s.add_argument_group("request limits (beyond a bound: 400, 413 or 429, before any engine work)")
    defaults = ServingLimits()
    for name, text in _LIMIT_HELP.items():
        kind = _size if name == "max_request_bytes" else int
        g.add_argument(option_name(name), type=kind, default=getattr(defaults, name),
                       help=f"{text} (default: %(default)s)")


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def _add_session_options(s: argparse.ArgumentParser) -> None:
    """``serve``: bounds on sessions (``session/``; beyond a bound: an immediate, clear refusal)."""
    d = _SESSION_DEFAULTS
    g = s.add_argument_group("sessions")
    g.add_argument("--max-sessions", type=int, default=d["max_sessions"],
                   help="resident sessions at most; beyond it opening one fails (code capacity) unless "
                        "--session-eviction evicts an idle one (default: %(default)s)")
    g.add_argument("--session-eviction", choices=["none", "lru"], default=d["session_eviction"],
                   help="lru: evict the idle session whose last step is the oldest when a new one needs room "
                        "or the KV pool is full; a later call on it fails with code evicted (default: %(default)s)")
    g.add_argument("--max-session-events", type=int, default=d["max_session_events"],
                   help="pending events per session; beyond it an event is refused (code backpressure) "
                        "(default: %(default)s)")
    g.add_argument("--realtime-grace-s", type=_grace, default=0.0,
                   help="seconds a /v1/realtime session outlives its dropped connection, for session.resume; "
                        "0 closes it at once (default: %(default)s)")


def _add_world_options(s: argparse.ArgumentParser) -> None:
    """``serve --world``: world sessions over /v1/realtime/video and the /world page (serve/world_server.py)."""
    g = s.add_argument_group("world sessions")
    g.add_argument("--world", nargs="?", const="world", default=None, metavar="WORLD_MODEL",
                   help="also serve world sessions (/v1/realtime/video, the /world page) with this world model: "
                        "a trained directory or 'world' (the default; without MODEL: a world-only server)")
    g.add_argument("--world-max-sessions", type=int, default=8,
                   help="resident world sessions at most; beyond it session.start is refused (code capacity) "
                        "(default: %(default)s)")
    g.add_argument("--world-session-memory", type=_size, default=4 << 20,
                   help="K/V memory budget of one world session (bytes, or a size such as 16MiB); a session or "
                        "checkpoint beyond it is refused (code budget) (default: 4MiB)")
    g.add_argument("--world-fps", type=float, default=16.0,
                   help="a world session's target frame rate unless session.start sets fps; 0: as fast as "
                        "possible (default: %(default)s)")
    g.add_argument("--world-threads", type=int, default=0, help="torch threads for world steps (0: torch's default)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="execstate", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("models", help="embedded and random models")
    msub = m.add_subparsers(dest="models_cmd", required=True)
    msub.add_parser("list", help="list embedded models")
    pr = msub.add_parser("prepare", help="build an embedded model into the cache")
    pr.add_argument("name")
    pr.add_argument("--force", action="store_true")
    mr = msub.add_parser("make-random", help="write a tiny random model of an architecture")
    mr.add_argument("arch")
    mr.add_argument("out")
    mr.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=_models)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_cmd", required=True)
    bt = bsub.add_parser("throughput", help="engine vs transformers (and llama.cpp) tokens/s")
    bt.add_argument("--model", default="standard", help="'standard', an embedded name or a path")
    bt.add_argument("--repeats", type=int, default=3)
    bt.add_argument("--threads", type=int, default=None)
    bt.add_argument("--no-peers", action="store_true", help="skip transformers/llama.cpp")
    bt.add_argument("--json", action="store_true")
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
    bd.add_argument("--threads", type=int, default=1)
    bd.add_argument("--seed", type=int, default=0)
    bd.add_argument("--png", default=None, help="write the timeline of the first conversation here")
    bd.add_argument("--json", action="store_true")
    bw = bsub.add_parser("world", help="world-model sessions: step latency, first chunk, event-to-action, "
                         "checkpoint/rollback vs recompute, compiled vs eager, 500-step memory, quality")
    bw.add_argument("--model", default=None, help="a trained world model directory (default: the default model)")
    bw.add_argument("--parts", default="latency,events,checkpoint,compiled,memory,quality",
                    help="comma-separated subset")
    bw.add_argument("--steps", type=int, default=64, help="steps of the latency, events and quality parts")
    bw.add_argument("--memory-steps", type=int, default=500)
    bw.add_argument("--compiled-steps", type=int, default=32)
    bw.add_argument("--episodes", type=int, default=4, help="quality part: episodes against the renderer")
    bw.add_argument("--threads", type=int, default=2, help="torch threads")
    bw.add_argument("--png", default=None, help="also write generated frames above the renderer's to this PNG")
    bw.add_argument("--json", action="store_true")
    b.set_defaults(func=_bench)

    d = sub.add_parser("demo", help="R3 rollout with prefix reuse and a replay check")
    d.add_argument("--model", default="smollm2-moe")
    d.set_defaults(func=_demo)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, /metrics)")
    s.add_argument("model", nargs="?", default=None,
                   help="embedded model name or a Hugging Face directory (optional with --world)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    s.add_argument("--served-model-name", default=None, help="the name clients pass as 'model' (default: MODEL)")
    s.add_argument("--enable-return-routed-experts", action="store_true", help="R3: return routed_experts")
    s.add_argument("--kv-transfer-config", default=None, help="PD connector settings as JSON (vLLM key names)")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "fp32", "bf16"])
    s.add_argument("--device", default="cpu")
    s.add_argument("--max-model-len", type=int, default=None)
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--kernels", default="auto", choices=["auto", "torch", "execstate"],
                   help="execstate's CPU kernels (auto: when available, CPU, fp32) or torch ops only; "
                        "recorded in provenance numerics, so P and D of a PD pair must agree")
    _add_capacity_and_limit_options(s)
    _add_session_options(s)
    s.add_argument("--agent-back-model", default=None,
                   help="/v1/realtime/agent: the back-end model agents delegate to (the tool 'reason'): an "
                        "embedded name or a directory, loaded as a second engine (default: the served model, "
                        "at batch priority; the front is always the served model)")
    _add_world_options(s)
    s.set_defaults(func=_serve)

    px = sub.add_parser("proxy", help="prefill/decode disaggregation proxy")
    px.add_argument("--prefill", nargs="+", required=True, help="prefill instance URL(s)")
    px.add_argument("--decode", nargs="+", required=True, help="decode instance URL(s)")
    px.add_argument("--host", default="127.0.0.1")
    px.add_argument("--port", type=int, default=8000)
    px.add_argument("--kv-secret", default=None,
                    help="verify P's handoff signatures with this secret (default: $EXECSTATE_KV_SECRET)")
    px.set_defaults(func=_proxy)

    from execstate.model.world.cli import add_world_parser

    add_world_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from execstate.logs import setup_cli_logging

    setup_cli_logging()
    return args.func(args)
