"""``bench offload`` part ``chat``: a multi-tenant chat workload whose working set is 4x the KV pool.

Workload: ``tenants`` tenants (each its own ``cache_salt``) with a system prompt each, and
``conversations`` conversations per tenant, each starting with its own context (a document, a
long instruction: ``context_len`` tokens); ``turns`` rounds in which every conversation, in a
random order (seeded; another each round), sends its whole history plus a new user message
(random token ids) and gets a reply (greedy, ``ignore_eos``). What a tier saves is the history a
request does not compute again, so the gain grows with the history's length against the new
message's: docs/offload.md gives both this default and a short-history run. The pool holds a quarter of the tokens
every conversation has at the
end (the working set), so a conversation's blocks are evicted before its next turn.

The same request sequence runs on one engine per configuration, **interleaved** (request i on
every engine before request i+1, the other engines' write-backs finished first), so load on a
shared machine hits all of them alike:

- ``none``: the pool only (an evicted history is recomputed);
- ``dram``: a DRAM tier of 1x the pool;
- ``dram+disk``: and a disk tier of 2x the pool;
- ``dram+disk+redis``: and a Redis tier of 4x the pool.

Tiers are write-through (each holds every unit it has room for), so the pool and the largest tier
cover 2x, 3x and 5x the pool. Reported per configuration: TTFT p50 / p99, prompt tokens
computed (prefill work) and served from the prefix cache or a tier, and whether every reply
(tokens and routes) equals the ``none`` engine's (it must).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from execstate.engine.sampling_params import SamplingParams
from execstate.session.lm.llm import LLM
from execstate_bench.redis_server import SHARED_SECRET

CONFIGS = ("none", "dram", "dram+disk", "dram+disk+redis")
log = logging.getLogger(__name__)


def build_workload(tenants: int, conversations: int, turns: int, system_len: int, context_len: int, user_len: int,
                   vocab: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]], list[list[list[int]]]]:
    """System prompts (one per tenant), each conversation's context and its user messages
    (conversations tenant-major)."""
    rng = np.random.default_rng(seed)
    n = tenants * conversations
    systems = [rng.integers(3, vocab, system_len).tolist() for _ in range(tenants)]
    contexts = [rng.integers(3, vocab, context_len).tolist() for _ in range(n)]
    users = [[rng.integers(3, vocab, user_len).tolist() for _ in range(turns)] for _ in range(n)]
    return systems, contexts, users


def run_chat(model_dir: Path, workdir: Path, redis_url: str | None, tenants: int = 4, conversations: int = 4,
             turns: int = 6, system_len: int = 128, context_len: int = 768, user_len: int = 64, reply_len: int = 8,
             block_size: int = 16) -> dict:
    systems, contexts, users = build_workload(tenants, conversations, turns, system_len, context_len, user_len,
                                              vocab_of(model_dir))
    working_set = tenants * system_len + tenants * conversations * (context_len + turns * (user_len + reply_len))
    pool_blocks = -(-working_set // (4 * block_size))
    max_len = system_len + context_len + turns * (user_len + reply_len) + block_size
    pool_blocks = max(pool_blocks, -(-max_len // block_size))
    configs = [c for c in CONFIGS if redis_url is not None or "redis" not in c]
    base: dict[str, Any] = dict(enable_return_routed_experts=True, num_kv_blocks=pool_blocks,
                                block_size=block_size, seed=0, max_model_len=max_len)
    engines = {"none": LLM(str(model_dir), **base)}
    unit = engines["none"].engine.kv_pool.unit_nbytes()
    for c in configs[1:]:
        engines[c] = LLM(str(model_dir), **base, **_tier_options(c, pool_blocks * unit, workdir / c, redis_url))
    params = SamplingParams(temperature=0.0, max_tokens=reply_len, ignore_eos=True)
    histories: list[list[int]] = [[] for _ in users]
    stats: dict[str, dict[str, Any]] = {
        c: {"ttft": [], "reload": [], "computed": 0, "local_cache": 0, "offloaded": 0} for c in configs}
    mismatches = 0
    order_rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    try:
        for turn in range(turns):
            log.info("offload chat: turn %d of %d (%d conversations, %d engines)", turn + 1, turns, len(users),
                     len(configs))
            for conv in order_rng.permutation(len(users)).tolist():
                tenant = conv // conversations
                if not histories[conv]:
                    histories[conv] = systems[tenant] + contexts[conv]
                prompt = histories[conv] + users[conv][turn]
                outs = {}
                for c in configs:
                    _quiet_others(engines, c)
                    off = engines[c].engine.offload
                    last = off.loads.last_done if off is not None else None
                    out = engines[c].generate({"prompt_token_ids": prompt, "cache_salt": f"tenant-{tenant}"}, params,
                                              use_tqdm=False)[0]
                    outs[c] = out
                    s = stats[c]
                    s["ttft"].append(out.metrics["ttft_s"])
                    done = off.loads.last_done if off is not None else None
                    if done is not None and done is not last:
                        s["reload"].append(done.seconds)
                    for k in ("computed", "local_cache", "offloaded"):
                        s[k] += out.prompt_token_sources[k]
                ref = outs[configs[0]].outputs[0]
                for c in configs[1:]:
                    got = outs[c].outputs[0]
                    if got.token_ids != ref.token_ids or _routes(got) != _routes(ref):
                        mismatches += 1
                histories[conv] = prompt + list(ref.token_ids)
        tiers = {c: [_tier(t) for t in e.engine.offload.snapshot()] if e.engine.offload is not None else []
                 for c, e in engines.items()}
    finally:
        for e in engines.values():
            if e.engine.offload is not None:
                e.engine.offload.close()
    rows = {}
    none_p50 = float(np.median(stats["none"]["ttft"]))
    for c in configs:
        s = stats[c]
        ttft = np.asarray(s["ttft"])
        rows[c] = {
            "ttft_p50_s": float(np.median(ttft)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "ttft_mean_s": float(ttft.mean()), "p50_speedup_vs_none": none_p50 / float(np.median(ttft)),
            "prefill_tokens_computed": s["computed"], "tokens_from_prefix_cache": s["local_cache"],
            "tokens_from_tiers": s["offloaded"], "tiers": tiers[c], "reloads": len(s["reload"]),
            "reload_p50_s": float(np.median(s["reload"])) if s["reload"] else None,
        }
    return {
        "workload": {
            "tenants": tenants,
            "conversations_per_tenant": conversations,
            "turns": turns,
            "system_len": system_len,
            "context_len": context_len,
            "user_len": user_len,
            "reply_len": reply_len,
            "requests": turns * len(users),
            "working_set_tokens": working_set,
            "pool_tokens": pool_blocks * block_size,
            "working_set_over_pool": working_set / (pool_blocks * block_size),
            "unit_bytes": unit,
            "interleaved": True,
        },
        "configs": rows,
        "reply_mismatches": mismatches,
        "seconds": time.perf_counter() - t0,
    }


def vocab_of(model_dir: Path) -> int:
    """Token ids the benchmark draws from: ``[3, min(vocab, 30000))``."""
    import json

    return min(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"], 30000)


def _quiet_others(engines: dict[str, LLM], current: str) -> None:
    """Let the other engines' write-backs finish first: in a deployment each engine has the process
    (and its cores) to itself; its own write-backs, which do overlap its next request, still run."""
    for c, e in engines.items():
        if c != current and e.engine.offload is not None:
            e.engine.offload.flush()


def _tier_options(config: str, pool_bytes: int, workdir: Path, redis_url: str | None) -> dict:
    kw: dict = {"offload_timeout_s": 10.0}
    if "dram" in config:
        kw["offload_dram_bytes"] = pool_bytes
    if "disk" in config:
        shutil.rmtree(workdir, ignore_errors=True)
        kw["offload_disk_dir"] = str(workdir / "disk")
        kw["offload_disk_bytes"] = 2 * pool_bytes
    if "redis" in config:
        kw["offload_redis_url"] = redis_url
        kw["offload_redis_bytes"] = 4 * pool_bytes
        kw["offload_secret"] = SHARED_SECRET
    return kw


def _tier(t) -> dict:
    return {"name": t.name, "units": t.units, "hits": t.hits, "misses": t.misses, "reloaded": t.reloaded,
            "write_backs": t.write_backs, "dropped": t.dropped, "checksum_failures": t.checksum_failures}


def _routes(completion) -> bytes | None:
    r = completion.routed_experts
    return None if r is None else r.tobytes()
