"""The start-up summary of ``execstate serve``: what was loaded and with which settings.

``log_startup(info)`` logs one INFO record (logger ``execstate.serve.startup``), a block of
``label  value`` lines built by ``startup_lines(info)`` from ``FIELDS``, in that order.
Adding a line is one edit: append ``(label, fn)`` to ``FIELDS``, where ``fn(info)`` returns
the value as text (``StartupInfo`` gives the engine's summary, the parsed CLI arguments, the PD
config and the start-up time). Values come from what was actually built (the engine's
config, pool and model), not from the flags alone. API keys are never logged (tenant names are);
a server without any key is open to whoever can reach it, which is logged again as a WARNING.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

from execstate.identity.scope import PrefixSharing
from execstate.kernels import cpu as cpu_kernels
from execstate.serve.limits import ServingLimits, option_name

if TYPE_CHECKING:
    from execstate.engine.engine_facts import EngineSummary
    from execstate.serve.kv_transfer_config import KVTransferConfig
    from execstate.serve.principals import KeyRing
    from execstate.session.runtime.manager import SessionPolicy

log = logging.getLogger("execstate.serve.startup")


@dataclass(frozen=True)
class StartupInfo:
    engine: EngineSummary  # what the engine was built with (``AsyncEngine.summary``)
    args: argparse.Namespace  # the `execstate serve` arguments
    kv_transfer_config: KVTransferConfig | None
    startup_seconds: float  # from run_server's start to the app being built
    limits: ServingLimits | None = None  # the request limits the app enforces
    keys: KeyRing | None = None  # the API keys' tenants (None: not given)
    policy: SessionPolicy | None = None  # idle expiry, checkpoints per session, quotas
    migration_targets: tuple[str, ...] = ()  # where sessions may migrate (``MigrationTargets.describe()``)
    sharing: PrefixSharing | None = None  # the operator's shared prefix groups

OPEN_WARNING = ("NO API KEY: this server is open. Anyone who can reach it can use, read and close every "
                "session; give --api-key or --api-keys-file (docs/security.md)")


def auth_line(i: StartupInfo) -> str:
    if i.keys is None or i.keys.open:
        return f"OFF - {OPEN_WARNING}"
    public = "/health, the browser pages" + (", /metrics" if getattr(i.args, "public_metrics", False) else "")
    return f"required on every path but {public}; tenants: {', '.join(i.keys.tenants)}"


def tenancy_line(i: StartupInfo) -> str:
    p = i.policy
    if p is None:
        return "n/a"
    ttl = "never expire" if p.idle_ttl_s is None else f"expire after {p.idle_ttl_s:g} s idle"
    quotas = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in vars(p.quotas).items() if v is not None)
    return (f"detached sessions {ttl}; {p.max_checkpoints} checkpoints per session; per-tenant "
            f"quotas: {quotas or 'none'}")


def migration_line(i: StartupInfo) -> str:
    t = i.migration_targets
    if not t:
        return "off (no --migration-targets)"
    return "to " + ", ".join(t)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _params(e: EngineSummary) -> str:
    n = e.num_parameters
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def model_line(i: StartupInfo) -> str:
    return f"{i.args.model} ({i.engine.model_path})"


def architecture_line(i: StartupInfo) -> str:
    mc = i.engine.model_config
    moe = f", {mc.num_moe_layers} MoE ({mc.num_experts} experts, top-{mc.top_k})" if mc.is_moe else ""
    return f"{mc.architecture}, {_params(i.engine)} parameters, {mc.num_layers} layers{moe}"


def kernels_line(i: StartupInfo) -> str:
    """Which kernels run and why (mirrors ``EngineConfig.use_cpu_kernels``)."""
    cfg = i.engine.config
    if i.engine.uses_cpu_kernels:
        why = "requested" if cfg.kernels == "execstate" else f"auto: extension built, AVX2+FMA, cpu, {cfg.dtype}"
        if cfg.dtype == "bfloat16":
            return f"execstate CPU kernels ({cpu_kernels.KERNEL_SET_BF16}: bf16 weights, fp32 activations; {why})"
        return f"execstate CPU kernels ({cpu_kernels.KERNEL_SET}; {why})"
    if cfg.kernels == "torch":
        why = "--kernels torch"
    elif torch.device(cfg.device).type != "cpu":
        why = f"auto: device is {cfg.device}"
    else:
        why = f"auto: {cpu_kernels.unavailable_reason()}"
    return f"torch ({why})"


def kv_line(i: StartupInfo) -> str:
    e = i.engine
    total = e.kv_bytes
    per_block = total // e.kv_num_blocks
    return (f"{e.kv_num_blocks} blocks x {e.kv_block_size} tokens = {e.kv_num_blocks * e.kv_block_size:,} tokens, "
            f"{_mib(total)} ({_mib(per_block)} per block)")


def limits_line(i: StartupInfo) -> str:
    """Every request limit with the option that sets it (new ``ServingLimits`` fields appear here)."""
    if i.limits is None:
        return "none"
    return ", ".join(f"{option_name(f.name)} {getattr(i.limits, f.name)}" for f in fields(i.limits)
                     if f.name != "max_waiting_requests")


def waiting_line(i: StartupInfo) -> str:
    if i.limits is None:
        return "unbounded"
    return f"{i.limits.max_waiting_requests} requests (429 with Retry-After beyond)"


def r3_line(i: StartupInfo) -> str:
    e = i.engine
    if e.return_routes and getattr(i.args, "routed_experts_on_request", False):
        return 'on (routed_experts returned to requests with "return_routed_experts": true)'
    if e.return_routes:
        return "on (routed_experts returned)"
    if e.config.enable_return_routed_experts:
        return "off (requested, but the model has no MoE layers)"
    return "off"


def pd_line(i: StartupInfo) -> str:
    kv = i.kv_transfer_config
    if kv is None:
        return "none"
    parts = [kv.kv_role, kv.kv_connector, f"failure policy {kv.kv_load_failure_policy}",
             f"route records {'on' if kv.enable_routed_experts_transfer else 'off'}"]
    e = i.engine
    if e.pd_instance_id is not None:
        parts.append(f"instance {e.pd_instance_id}")
        if e.pd_control_addr is not None:
            parts.append(f"control channel {e.pd_control_addr}")
    return ", ".join(parts)


def offload_line(i: StartupInfo) -> str:
    """The offload tiers (a Redis URL without its credentials)."""
    tiers = i.engine.offload_tiers
    if tiers is None:
        return "off"
    gib = 1 << 30
    parts = [f"{t.name} {t.capacity_bytes / gib:.1f} GiB" for t in tiers]
    cfg = i.engine.config
    if cfg.offload_disk_dir is not None:
        parts.append(f"disk dir {cfg.offload_disk_dir}")
    if cfg.offload_redis_url is not None:
        url = cfg.offload_redis_url
        parts.append(f"redis {url.split('://', 1)[0]}://{url.rsplit('@', 1)[-1].split('://', 1)[-1]}")
    parts.append(f"policy {cfg.offload_policy}, timeout {cfg.offload_timeout_s:g} s")
    parts.append("units signed with the shared secret" if i.engine.offload_shared_secret else
                 "units signed with a per-process key (readable by this process only)")
    return ", ".join(parts)


def identity_line(i: StartupInfo) -> str:
    """What the cache identity holds, and who shares a cache partition."""
    p = i.engine.provenance
    groups: dict[str, list[str]] = {}
    for tenant, group in (i.sharing.groups.items() if i.sharing is not None else ()):
        groups.setdefault(group, []).append(tenant)
    shared = "; ".join(f"group {g} shares one cache: {', '.join(sorted(t))}" for g, t in sorted(groups.items()))
    return (f"numerics {p.numerics}; each tenant's prefix cache is its own"
            + (f" ({shared})" if shared else ""))


def kv_events_line(i: StartupInfo) -> str:
    """Where the KV events feed is, who can read it and what it tells."""
    ev = i.engine.kv_events
    if ev is None:
        return "off"
    where = ev.endpoint + (f", replay {ev.replay_endpoint}" if ev.replay_endpoint else "")
    access = "CURVE, keys of the shared secret" if ev.secured else "loopback only"
    tokens = ("TOKEN IDS INCLUDED: subscribers learn what tenants asked (include_token_ids)"
              if ev.include_token_ids else "block keys only, no token ids")
    excluded = f"; tenants left out: {', '.join(sorted(ev.exclude_tenants))}" if ev.exclude_tenants else ""
    return f"{where} ({access}); {tokens}{excluded}"


def sessions_line(info: StartupInfo) -> str:
    cfg = info.engine.config
    return (f"at most {cfg.max_sessions} (eviction: {cfg.session_eviction or 'none'}), {cfg.max_session_events} "
            f"pending events each; /v1/realtime keeps a dropped connection's sessions "
            f"{info.args.realtime_grace_s:g} s")


def world_line(info: StartupInfo) -> str:
    """``serve MODEL --world``: the world endpoints on the same server (``serve/realtime/world/app.py``)."""
    a = info.args
    if getattr(a, "world", None) is None:
        return "off"
    return (f"/v1/realtime/video and /world: world model {a.world}, at most {a.world_max_sessions} sessions, "
            f"default fps {a.world_fps:g}, at most {a.world_max_frames} frames a session")


def agents_line(info: StartupInfo) -> str:
    back = getattr(info.args, "agent_back_model", None)
    return (f"/v1/realtime/agent: front = the served model; back-end model (tool 'reason') = "
            f"{back or 'the served model, batch priority'}; server tools calculator, lookup")


def voice_line(info: StartupInfo) -> str:
    a = info.args
    asr = getattr(a, "voice_asr", "pocketsphinx") or "pocketsphinx"
    phrases = getattr(a, "voice_asr_phrases", None)
    if asr == "pocketsphinx":
        asr += f" ({'phrases: ' + phrases if phrases else 'general English model'})"
    budget, hold = info.engine.config.interactive_batch_budget, info.engine.config.interactive_hold_s
    return (f"/v1/voice/realtime and /agent: ASR {asr} (--voice-asr), Silero VAD, eSpeak NG TTS; turn detection "
            f"server_vad by default, semantic_vad (the front scores the end of turn; eagerness low/medium/high) on "
            f"request and on /agent; batch budget under interactive steps {budget if budget is not None else 'off'} "
            f"tokens, batch held {round(hold * 1000)} ms after each")


FIELDS: list[tuple[str, Callable[[StartupInfo], str]]] = [
    ("model", model_line),
    ("architecture", architecture_line),
    ("dtype", lambda i: i.engine.config.dtype),
    ("kernels", kernels_line),
    ("device", lambda i: f"{i.engine.config.device}, {torch.get_num_threads()} threads"),
    ("KV cache", kv_line),
    ("max_model_len", lambda i: str(i.engine.max_model_len)),
    ("max_num_seqs", lambda i: str(i.engine.config.max_num_seqs)),
    ("max_num_batched_tokens", lambda i: str(i.engine.config.max_num_batched_tokens)),
    ("prefix caching", lambda i: "on" if i.engine.config.enable_prefix_caching else "off"),
    ("offload tiers", offload_line),
    ("identity", identity_line),
    ("KV events", kv_events_line),
    ("weights version", lambda i: i.engine.provenance.weights_version),
    ("waiting queue", waiting_line),
    ("request limits", limits_line),
    ("R3", r3_line),
    ("PD role", pd_line),
    ("served name", lambda i: i.args.served_model_name or str(i.args.model)),
    ("listening on", lambda i: f"http://{i.args.host}:{i.args.port}"),
    ("API keys", auth_line),
    ("tenancy", tenancy_line),
    ("migration", migration_line),
    ("sessions", lambda i: sessions_line(i)),
    ("agents", agents_line),
    ("voice", voice_line),
    ("world", world_line),
    ("start-up", lambda i: f"{i.startup_seconds:.1f} s (engine {i.engine.startup_seconds:.1f} s)"),
]


def startup_lines(info: StartupInfo) -> list[tuple[str, str]]:
    return [(label, fn(info)) for label, fn in FIELDS]


def format_block(lines: list[tuple[str, str]], title: str = "execstate serve ready") -> str:
    """``title``, then one ``label  value`` line each, the values aligned (``serve --world`` uses it too)."""
    width = max(len(label) for label, _ in lines)
    return title + "\n" + "\n".join(f"  {label:<{width}}  {value}" for label, value in lines)


def format_startup(info: StartupInfo) -> str:
    return format_block(startup_lines(info))


def log_startup(info: StartupInfo) -> None:
    log.info("%s", format_startup(info))
    if info.keys is not None and info.keys.open:
        log.warning("%s", OPEN_WARNING)
    ev = info.engine.kv_events
    if ev is not None and ev.include_token_ids:
        log.warning("KV events carry token ids (include_token_ids): every subscriber of %s can read the prompts "
                    "of every tenant not in exclude_tenants", ev.endpoint)
