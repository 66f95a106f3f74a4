"""Command line: ``execstate models|demo|serve|proxy ...``, and the commands other distributions add
(``bench``, ``world``: execstate/commands.py); heavy imports happen per command."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def _models(args: argparse.Namespace) -> int:
    if args.models_cmd == "list":
        from execstate.model.random_models import ARCHITECTURES
        from execstate.model.registry import list_models

        models = list_models()
        for m in models:
            print(f"{m['name']:<16} {m['state']:<13} {m['description']}")
        if any(m["state"] == "shipped" for m in models):
            print("shipped: its weights come with the package and are used as they are (`execstate models "
                  "prepare NAME` builds them here instead)")
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
            print(
                f"unknown architecture {args.arch!r}; choose from {', '.join(ARCHITECTURES)}, standard", file=sys.stderr
            )
            return 2
        return 0
    raise AssertionError(args.models_cmd)


def _demo(args: argparse.Namespace) -> int:
    from execstate.demo import run_demo

    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    return run_demo(model=args.model, parts=parts, out_dir=args.out)


def _proxy(args: argparse.Namespace) -> int:
    from execstate.serve.pd.proxy import run_proxy

    return run_proxy(args)


DEFAULT_SERVE_MODEL = "smollm2-moe"  # `execstate serve` with no MODEL: this model, the world model, every endpoint


def _serve(args: argparse.Namespace) -> int:
    from execstate.serve.server import run_server

    fleet_only = [flag for flag, given in (("--ray-address", args.ray_address is not None),
                                           ("--replica-host", args.replica_host != "127.0.0.1"),
                                           ("--replica-resources", args.replica_resources is not None),
                                           ("--fleet-operator", args.fleet_operator is not None)) if given]
    if fleet_only and not args.ray:
        print(f"execstate serve {fleet_only[0]}: a fleet option: add --ray (docs/fleet.md)", file=sys.stderr)
        return 2
    if args.ray and args.routed_experts_on_request:
        print("execstate serve --routed-experts-on-request: a single-server option; a fleet returns routes with "
              "--enable-return-routed-experts", file=sys.stderr)
        return 2
    if args.pd is not None and not args.ray:
        print("execstate serve --pd: a PD fleet runs on Ray: add --ray (single-machine PD: --kv-transfer-config and "
              "execstate proxy, docs/pd.md)", file=sys.stderr)
        return 2
    if args.ray:
        if args.model is None:
            print("execstate serve --ray: give the MODEL the replicas serve", file=sys.stderr)
            return 2
        from execstate.fleet.cluster_plan import keep_local

        keep_local(args.ray_address, args.replica_host)  # before Ray is imported: loopback only on one machine
        from execstate.fleet.ray_app.app import run_fleet

        return run_fleet(args)

    if args.model is None and args.world is None:  # the embedded default with every endpoint on
        args.model, args.world = DEFAULT_SERVE_MODEL, "world,maze"
        if not args.enable_return_routed_experts:  # routes recorded, returned to the requests that ask
            args.routed_experts_on_request = True
        print(f"execstate serve: no MODEL given: serving the embedded {DEFAULT_SERVE_MODEL} (routes returned to "
              f"requests with \"return_routed_experts\": true) and the world models (grid and maze), with every "
              f"endpoint (open http://{args.host}:{args.port}/)", file=sys.stderr)
    return run_server(args)


def _pd_shape(text: str) -> tuple[int, int]:
    """``--pd P,D``: the prefill and decode replica counts of a PD fleet."""
    parts = text.split(",")
    try:
        shape = (int(parts[0]), int(parts[1])) if len(parts) == 2 else None
    except ValueError:
        shape = None
    if shape is None or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"--pd takes P,D (two counts >= 1), got {text!r}")
    return shape


def _json_object(text: str) -> dict[str, float]:
    """``--replica-resources JSON``: an object of resource names to amounts (numbers >= 0)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
            for k, v in value.items()):
        raise argparse.ArgumentTypeError(f"expected a JSON object of resource names to amounts >= 0, got {text!r}")
    return {k: float(v) for k, v in value.items()}


def _chat_template(text: str) -> str:
    """``--chat-template``: a template file or the template's text, read and compiled once (vLLM's option)."""
    from execstate.engine.chat_template import load_chat_template

    try:
        return load_chat_template(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    from execstate.serve.limits import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# Defaults of the engine's capacity options (EngineConfig's; tests/serve/test_limits.py checks
# they agree; engine.config imports torch, which --help should not wait for).
_ENGINE_DEFAULTS = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "kv_cache_memory": 1 << 30,
                    "prompt_logprobs_chunk_tokens": 512}

# Defaults of the offload options (EngineConfig's; tests/engine/test_offload_options.py checks they agree).
_OFFLOAD_DEFAULTS = {"offload_disk_bytes": 16 << 30, "offload_redis_bytes": 4 << 30, "offload_policy": "lru",
                     "offload_timeout_s": 1.0}

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
    "max_logprobs_prompt_tokens": "longest prompt scored for echo logprobs or prompt_logprobs (tokens); "
                                  "longer gets 400",
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
    g.add_argument("--prompt-logprobs-chunk-tokens", type=int, default=e["prompt_logprobs_chunk_tokens"],
                   help="prompt tokens a request that scores its prompt (echo logprobs, prompt_logprobs) runs per "
                        "engine step: the requests beside it keep getting tokens (default: %(default)s)")
    g.add_argument("--prefault-kv", action="store_true",
                   help="map the whole KV pool's pages at start (a background thread; ~0.5 s CPU per GiB, the "
                        "pool becomes resident) so prefills into fresh blocks pay no page faults (default: off)")
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


def _positive_seconds(text: str) -> float:
    value = _grace(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
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


def _ttl(text: str) -> float | None:
    value = _grace(text)
    return None if value == 0 else value


def _quota(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


_QUOTA_HELP = {
    "sessions": "resident LM sessions (session API and /v1/realtime)",
    "checkpoints": "live checkpoints over all its LM sessions",
    "pinned_blocks": "KV blocks its sessions and checkpoints pin (a step that could pass it is refused)",
    "agents": "live /v1/realtime/agent agents",
    "world_sessions": "resident world sessions",
}


def _add_trust_options(s: argparse.ArgumentParser) -> None:
    """``serve``: tenants, quotas, expiry and migration targets (docs/security.md)."""
    g = s.add_argument_group("tenants, quotas and migration (docs/security.md)")
    g.add_argument("--api-keys-file", default=None, metavar="FILE",
                   help="API keys of several tenants: one 'KEY TENANT' per line ('#' comments); each tenant's "
                        "sessions are invisible to the others (default: none)")
    g.add_argument("--public-metrics", action="store_true",
                   help="with API keys: /metrics answers without one (it names tenants, never keys); every other "
                        "path but /health and the browser pages needs a key (default: off)")
    g.add_argument("--shared-prefix-group", action="append", default=None, metavar="GROUP=TENANT[,TENANT...]",
                   help="let these tenants share one prefix cache (e.g. a common system prompt); each tenant's "
                        "cache is private by default, and in a group each member can learn by timing or "
                        "cached_tokens what another sent (docs/security.md); repeatable (default: none)")
    g.add_argument("--session-idle-ttl", type=_ttl, default=600.0, metavar="SECONDS",
                   help="a detached session (opened over HTTP, or left by a dropped connection) unused this long "
                        "expires and releases everything; later calls get 'expired'; 0: never "
                        "(default: %(default)s)")
    g.add_argument("--session-hibernate-after", type=_ttl, default=None, metavar="SECONDS",
                   help="a detached session unused this long hibernates: its KV goes to the offload tiers, its "
                        "pool blocks are released, and the next call wakes it (docs/offload.md); below "
                        "--session-idle-ttl; 0 or unset: never (default: %(default)s)")
    g.add_argument("--max-session-checkpoints", type=int, default=64,
                   help="live checkpoints per session; one more is refused (code checkpoint_limit) "
                        "(default: %(default)s)")
    for kind, text in _QUOTA_HELP.items():
        g.add_argument(f"--tenant-max-{kind.replace('_', '-')}", type=_quota, default=None, metavar="N",
                       help=f"per tenant: {text} at most; beyond it, code quota (default: unlimited)")
    g.add_argument("--migration-targets", action="append", default=None, metavar="TARGET",
                   help="where POST /v1/sessions/{id}/migrate may send a session: 'http(s)://host:port' or "
                        "'ENGINE_ID=http(s)://host:port', comma-separated or repeated (default: none: migration "
                        "is off)")
    g.add_argument("--migration-skew-s", type=_grace, default=30.0, metavar="SECONDS",
                   help="the clock skew allowed between instances: a hand-over's nonce is remembered this long past "
                        "its expiry, and a source whose target never confirmed an abort serves the session again "
                        "only this long after the offer expired (default: %(default)s)")
def _fps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value == 0 or 1 <= value <= 240):
        raise argparse.ArgumentTypeError(f"must be 0 (as fast as possible) or 1 to 240 frames per second, got {text!r}")
    return value


def _timeout(text: str) -> float:
    value = _grace(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _add_offload_options(s: argparse.ArgumentParser) -> None:
    """``serve``: offload tiers under the KV pool (engine/offload.py, docs/offload.md)."""
    d = _OFFLOAD_DEFAULTS
    g = s.add_argument_group("offload tiers (a block evicted from the KV pool is written back to each tier; a "
                             "prompt that misses the pool reloads its blocks from them, verified)")
    g.add_argument("--offload-dram", type=_size, default=0, metavar="BYTES",
                   help="host-memory tier: bytes or a size such as 4GiB (default: 0, no DRAM tier)")
    g.add_argument("--offload-disk-dir", default=None, metavar="DIR",
                   help="local-disk tier: one file per unit under DIR; kept across restarts (default: none)")
    g.add_argument("--offload-disk-bytes", type=_size, default=d["offload_disk_bytes"], metavar="BYTES",
                   help="most bytes of the disk tier; the oldest units are deleted beyond it (default: 16GiB)")
    g.add_argument("--offload-redis-url", default=None, metavar="URL",
                   help="shared tier on a Redis server, e.g. redis://127.0.0.1:6379/0 (default: none)")
    g.add_argument("--offload-redis-bytes", type=_size, default=d["offload_redis_bytes"], metavar="BYTES",
                   help="most bytes this server keeps in Redis; its oldest units are deleted beyond it (default: 4GiB)")
    g.add_argument("--offload-policy", choices=["lru", "fifo"], default=d["offload_policy"],
                   help="which units a full tier drops first: least recently used, or oldest written "
                        "(default: %(default)s)")
    g.add_argument("--offload-timeout", type=_timeout, default=d["offload_timeout_s"], metavar="SECONDS",
                   help="longest a reload (and one Redis command) may take; beyond it the rest of the prompt is "
                        "recomputed and a failing tier is skipped for a while (default: %(default)s)")


def _add_world_options(s: argparse.ArgumentParser) -> None:
    """``serve --world``: world sessions over /v1/realtime/video and the /world page (serve/realtime/world/app.py)."""
    g = s.add_argument_group("world sessions")
    g.add_argument("--world", nargs="?", const="world,maze", default=None, metavar="WORLDS",
                   help="also serve world sessions (/v1/realtime/video, the /world page) of these worlds, "
                        "comma-separated, the first the default: 'world' (the grid world's shipped model), 'maze' "
                        "(the first-person maze's) or trained directories; --world alone: world,maze (without "
                        "MODEL: a world-only server) (default: no world sessions)")
    g.add_argument("--world-max-sessions", type=int, default=8,
                   help="resident world sessions at most; beyond it session.create is refused (code capacity) "
                        "(default: %(default)s)")
    g.add_argument("--world-session-memory", type=_size, default=8 << 20,
                   help="K/V memory budget of one world session (bytes, or a size such as 16MiB); a session or "
                        "checkpoint beyond it is refused (code budget) (default: 8MiB)")
    g.add_argument("--world-fps", type=_fps, default=16.0,
                   help="a world session's target frame rate unless session.create sets fps: 0 (as fast as "
                        "possible) or 1 to 240 (default: %(default)s)")
    g.add_argument("--world-max-frames", type=int, default=100_000,
                   help="most frames one world session may ask for (session.create's num_frames); beyond it "
                        "session.create is refused (invalid_message) (default: %(default)s)")
    g.add_argument("--world-step-workers", type=int, default=1,
                   help="world steps computed at once (threads); with --world-threads 1, one per core runs one "
                        "session per core (default: %(default)s)")
    g.add_argument("--world-threads", type=int, default=0,
                   help="torch threads for world steps, 0: torch's default (default: %(default)s)")


DESCRIPTION = ("execstate: an LLM inference runtime whose cache holds execution state. `execstate serve` with no "
               "model serves everything at once (the OpenAI-compatible API, sessions, the world model, agents); "
               "`execstate demo` tours the three workloads; `execstate COMMAND --help` shows a command's options.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="execstate", description=DESCRIPTION)
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

    d = sub.add_parser("demo", help="a tour of the three workloads: R3 rollout, world session, duplex agent")
    d.add_argument("--model", default="smollm2-moe", help="the MoE model of the R3 part (default: %(default)s)")
    d.add_argument("--parts", default="r3,world,agent", help="which parts to run, comma-separated "
                   "(default: %(default)s)")
    d.add_argument("--out", type=Path, default=None,
                   help="where the world part saves its PNG (default: $EXECSTATE_CACHE/demo)")
    d.set_defaults(func=_demo)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, /metrics)")
    s.add_argument("model", nargs="?", default=None,
                   help="embedded model name (execstate models list), a Hugging Face directory, or a Hugging Face "
                        "repo id (namespace/name) the local Hugging Face cache holds, read offline: never a "
                        "download (default: none: without MODEL and --world, the embedded "
                        f"{DEFAULT_SERVE_MODEL} with routes returned on request and the world model, every endpoint "
                        "on; optional with --world)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    s.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every path but /health and the browser pages (see "
                        "--public-metrics); repeat for several keys (all of the tenant "
                        "'default'); see --api-keys-file for keys of several tenants (default: none: the server is "
                        "open to anyone who can reach it)")
    s.add_argument("--served-model-name", default=None, help="the name clients pass as 'model' (default: MODEL)")
    s.add_argument("--chat-template", type=_chat_template, default=None, metavar="TEMPLATE",
                   help="the Jinja chat template every chat prompt is rendered with (chat completions, /tokenize, "
                        "sessions' chat turns), as vLLM takes it: a template file's path, or the template's text "
                        "(default: the model's own)")
    s.add_argument("--enable-return-routed-experts", action="store_true",
                   help="R3, as vLLM: record each token's MoE routes and return routed_experts with every "
                        "completion (a request's \"return_routed_experts\": false leaves them out) (default: off)")
    s.add_argument("--routed-experts-on-request", action="store_true",
                   help="R3, as SGLang: record the routes but return routed_experts only to a request that asks "
                        "(\"return_routed_experts\": true); what `execstate serve` with no MODEL does "
                        "(default: off)")
    s.add_argument("--kv-transfer-config", default=None,
                   help="PD connector settings as JSON (vLLM key names) (default: none, no PD)")
    s.add_argument("--kv-events-config", default=None,
                   help="publish KV cache events (BlockStored/BlockRemoved/AllBlocksCleared, vLLM's shape, keyed by "
                        "execution-state block keys) on ZeroMQ: JSON with vLLM's KVEventsConfig fields, e.g. "
                        "'{\"enable_kv_cache_events\": true, \"replay_endpoint\": \"tcp://127.0.0.1:5558\"}'; "
                        "loopback by default (another address needs $EXECSTATE_KV_SECRET: CURVE), block keys "
                        "without token ids unless \"include_token_ids\": true, \"exclude_tenants\": [...] "
                        "leaves tenants out (default: none, no events; docs/security.md)")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "fp32", "bf16"],
                   help="weights' dtype (default: %(default)s)")
    s.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    s.add_argument("--max-model-len", type=int, default=None,
                   help="longest context, prompt and output together (default: the model's)")
    s.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="the engine's sampling seed (default: %(default)s)")
    s.add_argument("--kernels", default="auto", choices=["auto", "torch", "execstate"],
                   help="execstate's CPU kernels (auto: when available, CPU, fp32) or torch ops only; "
                        "recorded in provenance numerics, so P and D of a PD pair must agree (default: %(default)s)")
    _add_capacity_and_limit_options(s)
    _add_session_options(s)
    _add_trust_options(s)
    _add_offload_options(s)
    s.add_argument("--agent-back-model", default=None,
                   help="/v1/realtime/agent: the back-end model agents delegate to (the tool 'reason'): an "
                        "embedded name or a directory, loaded as a second engine (default: the served model, "
                        "at batch priority; the front is always the served model)")
    s.add_argument("--agent-tool-timeout-s", type=_positive_seconds, default=60.0,
                   help="/v1/realtime/agent: a back-end task (a tool) still running after this many seconds "
                        "fails with error 'timeout' (default: %(default)s)")
    s.add_argument("--agent-max-tasks", type=int, default=8,
                   help="/v1/realtime/agent: back-end tasks one agent runs at once; beyond it a delegation is "
                        "refused (error too_many_tasks) (default: %(default)s)")
    s.add_argument("--voice-asr", default="pocketsphinx", choices=("pocketsphinx", "moonshine"),
                   help="/v1/voice/realtime and /agent: the speech recognizer: pocketsphinx (streaming, fast, "
                        "error-prone) or moonshine (Moonshine base: a fraction of the word errors, about 0.2 s of "
                        "CPU per second of speech, transcribed in the background) (default: %(default)s)")
    s.add_argument("--voice-asr-phrases", default=None,
                   help="/v1/voice/realtime and /agent: recognise speech with a language model built from these "
                        "phrases ('demo': the demo's arithmetic and conversation phrases; else a file, one phrase "
                        "a line) instead of PocketSphinx's general English model (default: none: the general "
                        "model)")
    _add_world_options(s)
    g = s.add_argument_group("fleet (Ray Serve; the 'fleet' extra: pip install 'execstate[fleet]'; docs/fleet.md)")
    g.add_argument("--ray", action="store_true",
                   help="serve MODEL as a fleet of --replicas engine replicas on a local Ray cluster, behind one "
                        "OpenAI-compatible ingress on --host/--port and execstate's router (execution-compatible "
                        "prefix, load, session affinity) (default: one engine, no Ray)")
    g.add_argument("--replicas", type=int, default=2,
                   help="engine replicas of the fleet (--ray) (default: %(default)s)")
    g.add_argument("--session-copy-every", type=float, default=1.0, metavar="SECONDS",
                   help="with --ray and --offload-redis-url: each replica copies its live sessions that changed "
                        "to the shared tier this often, so a lost replica's sessions resume on another one (the "
                        "steps after the last copy are lost); 0: never (default: %(default)s)")
    g.add_argument("--pd", type=_pd_shape, default=None, metavar="P,D",
                   help="with --ray: a PD fleet of P prefill and D decode replicas instead of --replicas engine "
                        "replicas; the ingress runs each prompt's prefill on a prefill replica and its decode on a "
                        "decode replica of the same weights version, both chosen by execstate's router, the KV moving "
                        "between them over NIXL with a signed handoff (default: no PD)")
    g.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="with --ray: join an existing Ray cluster ('auto', or HEAD:PORT of `ray start --head`) "
                        "instead of starting a local one (default: a local cluster)")
    g.add_argument("--replica-host", default="127.0.0.1", metavar="HOST",
                   help="with --ray: the address each engine replica binds and advertises (its HTTP server, KV "
                        "events, KV connector); 'node': its Ray node's IP, for replicas on several hosts "
                        "(default: %(default)s)")
    g.add_argument("--fleet-operator", action="append", default=None, metavar="TENANT",
                   help="with --ray and --api-keys-file: a tenant whose keys may change the fleet (POST "
                        "/v1/fleet/drain, /v1/fleet/update_weights); repeat for several. GET /v1/fleet/replicas "
                        "needs any key (default: no tenant may change a keyed fleet; an open fleet is its "
                        "operator's)")
    g.add_argument("--replica-resources", type=_json_object, default=None, metavar="JSON",
                   help="with --ray: custom Ray resources each engine replica reserves, e.g. "
                        "'{\"execstate_engine\": 1}' with `ray start --resources` on the hosts that take one "
                        "(default: none)")
    s.set_defaults(func=_serve)

    px = sub.add_parser("proxy", help="prefill/decode disaggregation proxy")
    px.add_argument("--prefill", nargs="+", required=True, help="prefill instance URL(s)")
    px.add_argument("--decode", nargs="+", required=True, help="decode instance URL(s)")
    px.add_argument("--host", default="127.0.0.1")
    px.add_argument("--port", type=int, default=8000)
    px.add_argument("--kv-secret", default=None,
                    help="verify P's handoff signatures with this secret (default: $EXECSTATE_KV_SECRET)")
    px.set_defaults(func=_proxy)

    from execstate.commands import add_commands

    add_commands(sub)  # last: `bench`, `world` and any command a distribution registers (execstate/commands.py)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a command; a model name that names no model, or a world tool that is not installed (``execstate
    models prepare world`` from a wheel), is one line on stderr and status 2."""
    args = build_parser().parse_args(argv)
    from execstate.logs import setup_cli_logging
    from execstate.model.errors import UnknownModelError
    from execstate.model.world.tools_import import WorldToolsMissing

    setup_cli_logging()
    try:
        return args.func(args)
    except (UnknownModelError, WorldToolsMissing) as exc:
        print(f"execstate {args.cmd}: {exc}", file=sys.stderr)
        return 2
