"""``bench offload`` part ``reload``: reload from each tier vs recompute, at 1k / 4k / 16k tokens.

One engine with every tier (DRAM, disk, Redis) and a pool that holds the longest prompt. For each
length and repeat, side by side (so load on a shared machine hits every row alike), on a fresh
prompt of random token ids (``max_tokens=1``):

1. ``recompute``: the prompt served cold (nothing cached anywhere): its TTFT is the prefill;
2. the pool is emptied (every cached block evicted, so written back to every tier);
3. ``dram``: served again, its blocks reloaded from DRAM; the pool is emptied again and DRAM's
   copies dropped; ``disk``: reloaded from disk with the files in the page cache;
   ``disk-cold``: the same after ``posix_fadvise(DONTNEED)`` on the unit files (their pages
   dropped: read from the device); ``redis``: with DRAM's and disk's copies dropped.

An untimed warm-up cycle at the shortest length comes first. Per row: the median TTFT (request arrival -> first
token: the reload, its verification and the
forward pass over the last prompt token) and the reload job's own time and rate (GB/s of unit KV
bytes); ratio = recompute TTFT / tier TTFT. Every served first token must equal the recomputed
one. The standard model allows 4096 positions: for 16k the bench uses the same weights with the
position limit raised (RoPE needs no other change; the numbers below 4096 are those of the
standard model).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from execstate.engine.sampling_params import SamplingParams
from execstate.identity.keys import BlockKey
from execstate.session.lm.llm import LLM
from execstate.state.tiers.disk_store import DiskStore
from execstate_bench.offload_chat import vocab_of
from execstate_bench.redis_server import SHARED_SECRET

TIERS = ("dram", "disk", "disk-cold", "redis")
log = logging.getLogger(__name__)


def long_context_copy(model_dir: Path, out: Path, positions: int) -> Path:
    """``model_dir`` with ``max_position_embeddings`` raised to ``positions`` (weights linked)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("max_position_embeddings", 0) >= positions:
        return model_dir
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    cfg["max_position_embeddings"] = positions
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def run_reload(model_dir: Path, workdir: Path, redis_url: str | None, lengths: tuple[int, ...] = (1024, 4096, 16384),
               repeats: int = 3, block_size: int = 16) -> dict:
    longest = max(lengths)
    model = long_context_copy(Path(model_dir), workdir / "model-long", longest + 64)
    blocks = -(-longest // block_size) + 16
    unit = _unit_bytes(model, block_size)
    kw: dict = dict(enable_return_routed_experts=True, num_kv_blocks=blocks, block_size=block_size,
                    max_model_len=longest + 8, offload_dram_bytes=(blocks + 8) * unit,
                    offload_disk_dir=str(workdir / "disk"), offload_disk_bytes=4 * blocks * unit,
                    offload_timeout_s=60.0)
    tiers = [t for t in TIERS if redis_url is not None or t != "redis"]
    if redis_url is not None:
        kw.update(offload_redis_url=redis_url, offload_redis_bytes=4 * blocks * unit, offload_secret=SHARED_SECRET)
    llm = LLM(str(model), **kw)
    off = llm.engine.offload
    assert off is not None and llm.engine.kv_pool.unit_nbytes() == unit
    params = SamplingParams(temperature=0.0, max_tokens=1)
    vocab = vocab_of(model)
    rows: dict[int, dict[str, dict[str, list[float]]]] = {}
    mismatches = 0
    try:
        _warm_up(llm, tiers, min(lengths), vocab, params, block_size)
        for n in lengths:
            per = rows[n] = {t: {"ttft": [], "job": []} for t in ("recompute", *tiers)}
            for rep in range(repeats):
                log.info("offload reload: %d tokens, repeat %d of %d", n, rep + 1, repeats)
                ids = np.random.default_rng(1000 * n + rep).integers(3, vocab, n).tolist()
                keys = _keys(llm, ids, block_size)
                cold = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
                per["recompute"]["ttft"].append(cold.metrics["ttft_s"])
                for tier in tiers:
                    _empty_pool(llm)
                    _drop_above(llm, keys, tier)
                    out = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
                    done = off.loads.last_done
                    assert done is not None  # the generate above reloaded
                    full = (n - 1) // block_size * block_size
                    if out.prompt_token_sources["offloaded"] < full or set(done.sources) != {tier.split("-")[0]}:
                        raise RuntimeError(f"{n} tokens from {tier}: served {out.prompt_token_sources}, "
                                           f"sources {set(done.sources)}, failures {done.failures}")
                    per[tier]["ttft"].append(out.metrics["ttft_s"])
                    per[tier]["job"].append(done.seconds)
                    mismatches += out.outputs[0].token_ids != cold.outputs[0].token_ids
                _empty_pool(llm)
                _forget(llm, keys)
    finally:
        off.close()
    return {"lengths": list(lengths), "repeats": repeats, "unit_bytes": unit, "model_positions": longest + 64,
            "rows": _summarise(rows, unit, block_size), "first_token_mismatches": mismatches}


def _warm_up(llm: LLM, tiers: list[str], n: int, vocab: int, params: SamplingParams, block_size: int) -> None:
    """One untimed cold run and reload from each tier: thread pools, kernel scratch buffers and the
    pool's pages are set up before the first measurement."""
    ids = np.random.default_rng(7).integers(3, vocab, n).tolist()
    keys = _keys(llm, ids, block_size)
    llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)
    for tier in tiers:
        _empty_pool(llm)
        _drop_above(llm, keys, tier)
        llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)
    _empty_pool(llm)
    _forget(llm, keys)


def _unit_bytes(model: Path, block_size: int) -> int:
    """KV bytes of one block (fp32 KV: the engine's default dtype)."""
    cfg = json.loads((model / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * block_size * cfg["num_key_value_heads"] * head_dim * 4


def _summarise(rows: dict, unit: int, block_size: int) -> dict:
    out: dict = {}
    for n, per in rows.items():
        rec = float(np.median(per["recompute"]["ttft"]))
        nbytes = (n // block_size) * unit
        out[str(n)] = {"recompute_ttft_s": rec, "kv_bytes": nbytes}
        for tier, v in per.items():
            if tier == "recompute":
                continue
            ttft, job = float(np.median(v["ttft"])), float(np.median(v["job"]))
            out[str(n)][tier] = {"ttft_s": ttft, "reload_job_s": job, "reload_gb_s": nbytes / job / 1e9,
                                 "speedup_vs_recompute": rec / ttft, "ttft_all_s": v["ttft"]}
    return out


def _keys(llm: LLM, ids: list[int], bs: int) -> list[BlockKey]:
    return llm.engine.kv_manager.identity().chain(ids, bs)


def _empty_pool(llm: LLM) -> None:
    """Evict every cached block of the pool (each is written back) and wait for the write-backs."""
    pool = llm.engine.block_pool
    pool.free(list(reversed(pool.allocate(pool.num_free))))
    assert llm.engine.offload is not None and llm.engine.offload.flush(300)


def _drop_above(llm: LLM, keys: list[BlockKey], tier: str) -> None:
    """Drop the copies the tiers before ``tier`` hold, so the reload reads from ``tier``."""
    off = llm.engine.offload
    assert off is not None
    if tier == "dram":
        return
    for k in keys:
        off.host.discard(k)
    disk = next(s for s in off.stores if s.name == "disk" and isinstance(s, DiskStore))
    if tier == "disk-cold":
        for k in keys:
            with contextlib.suppress(OSError):
                fd = os.open(disk.path_of(k), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        time.sleep(0.01)
    if tier == "redis":
        for k in keys:
            disk.discard(k)


def _forget(llm: LLM, keys: list[BlockKey]) -> None:
    off = llm.engine.offload
    assert off is not None
    for k in keys:
        off.host.discard(k)
        for s in off.stores:
            s.discard(k)
