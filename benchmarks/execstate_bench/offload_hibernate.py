"""``execstate bench offload --parts hibernate``: idle sessions hibernated and woken (docs/offload.md).

Per tier (``dram``: units in the DRAM tier; ``redis``: no DRAM tier, units and manifests on the
Redis server), on one engine whose pool holds a few sessions:

1. ``sessions`` sessions each step a distinct ``tokens``-token context (one generated token) and
   hibernate at once (``Session.hibernate``: units written, manifest published, pool blocks
   released); then the pool's cached blocks are evicted, so the pool is back to empty (every
   block free and uncached) and no session holds a block;
2. each session is woken and steps one input token (``max_tokens=1``): **wake** = ``wake()``
   (claim, manifest verified, state rebuilt), **wake to first token** = wake + the step (its KV
   reloaded from the tier, verified, plus the tail and the new token computed); p50 / p99 over
   the sessions, compared with the first step's prefill of the same context (recompute);
3. the first ``check`` sessions also run on an engine without tiers (twins that never slept): the
   woken sessions' tokens and routes must equal theirs.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from execstate_bench.redis_server import SHARED_SECRET

TIERS = ("dram", "redis")


def run_hibernate(model_dir: Path, workdir: Path, redis_url: str | None, sessions: int = 1000, tokens: int = 2048,
                  check: int = 4, block_size: int = 16) -> dict:
    from execstate_bench.offload_chat import vocab_of
    from execstate_bench.offload_reload import long_context_copy

    model = long_context_copy(Path(model_dir), workdir / "model-long", tokens + 128)
    rng = np.random.default_rng(0)
    vocab = vocab_of(model)
    contexts = [rng.integers(3, vocab - 1, tokens).tolist() for _ in range(sessions)]
    inputs = [[int(rng.integers(3, vocab - 1))] for _ in range(sessions)]
    twins = _twins(model, contexts[:check], inputs[:check], tokens, block_size)
    out: dict = {"workload": {"sessions": sessions, "tokens_per_session": tokens, "checked": min(check, sessions),
                              "block_size": block_size}, "tiers": {}}
    for tier in TIERS:
        if tier == "redis" and redis_url is None:
            continue
        out["tiers"][tier] = _one_tier(model, tier, redis_url, contexts, inputs, twins, tokens, block_size)
    out["mismatches"] = sum(t["mismatches"] for t in out["tiers"].values())
    return out


def _engine(model: Path, tier: str | None, redis_url: str | None, sessions: int, tokens: int, block_size: int):
    from execstate.session.lm.llm import LLM
    from execstate_bench.offload_reload import _unit_bytes

    per = -(-tokens // block_size) + 2
    kw: dict = dict(enable_return_routed_experts=True, num_kv_blocks=4 * per, block_size=block_size,
                    max_model_len=tokens + 128, max_sessions=sessions + 8, seed=0, offload_timeout_s=60.0)
    if tier is not None:
        unit = _unit_bytes(model, block_size)
        if tier == "dram":
            kw["offload_dram_bytes"] = (sessions * per + 64) * unit
        else:
            kw.update(offload_redis_url=redis_url, offload_redis_bytes=(sessions * per + 64) * unit,
                      offload_secret=SHARED_SECRET)
    return LLM(str(model), **kw)


def _twins(model: Path, contexts: list, inputs: list, tokens: int, block_size: int) -> list:
    from execstate import SamplingParams

    llm = _engine(model, None, None, len(contexts), tokens, block_size)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    out = []
    for ctx, inp in zip(contexts, inputs, strict=True):
        s = llm.open_session(sampling_params=params)
        s.step(ctx)
        r = s.step(inp)
        out.append((r.token_ids, None if r.routed_experts is None else r.routed_experts.tobytes()))
        s.close()
    return out


def _one_tier(model: Path, tier: str, redis_url: str | None, contexts: list, inputs: list, twins: list, tokens: int,
              block_size: int) -> dict:
    from execstate import SamplingParams

    llm = _engine(model, tier, redis_url, len(contexts), tokens, block_size)
    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    handles, prefill, sleep = [], [], []
    try:
        for ctx in contexts:
            s = llm.open_session(sampling_params=params)
            t0 = time.perf_counter()
            s.step(ctx)
            prefill.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            s.hibernate()
            sleep.append(time.perf_counter() - t0)
            handles.append(s)
        assert eng.offload is not None and eng.offload.flush(600)
        pool = eng.block_pool
        pool.free(pool.allocate(pool.num_free))  # evict every cached block: the pool is back to empty
        empty = pool.num_used == 0 and pool.num_cached == 0 and eng.kv_holds.num_holders == 0
        stored = sum(s.info().status == "hibernated" for s in handles)
        wake, first, verified, mismatches = [], [], 0, 0
        for i, s in enumerate(handles):
            t0 = time.perf_counter()
            s.wake()
            t1 = time.perf_counter()
            r = s.step(inputs[i])
            t2 = time.perf_counter()
            wake.append(t1 - t0)
            first.append(t2 - t0)
            done = eng.offload.loads.last_done
            verified += done.num_verified if done is not None else 0
            if i < len(twins):
                routes = None if r.routed_experts is None else r.routed_experts.tobytes()
                mismatches += (r.token_ids, routes) != twins[i]
            s.hibernate()  # back to sleep: the pool stays near empty for the next one
            pool.free(pool.allocate(pool.num_free))
        return {"hibernated": stored, "pool_empty_after_hibernation": empty,
                "units_per_session": tokens // block_size, "units_reloaded": verified,
                "hibernate_p50_s": _p(sleep, 50), "wake_p50_s": _p(wake, 50), "wake_p99_s": _p(wake, 99),
                "wake_to_first_token_p50_s": _p(first, 50), "wake_to_first_token_p99_s": _p(first, 99),
                "recompute_p50_s": _p(prefill, 50),
                "speedup_vs_recompute": _p(prefill, 50) / max(_p(first, 50), 1e-9),
                "hibernated_bytes": sum(v.get("hibernated_bytes", 0) for v in llm.sessions.usage().values()),
                "mismatches": mismatches}
    finally:
        llm.sessions.close_all()
        if eng.offload is not None:
            eng.offload.close()


def _p(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")
