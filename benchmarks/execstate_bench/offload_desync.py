"""Desync injection over the offload tiers (``execstate_bench/desync.py`` targets for DRAM, disk and Redis).

Each :class:`TierDesyncTarget` runs one engine whose only tier is the one under test (signing its
units with a secret), an oracle engine without tiers, and, for ``other_weights``, a donor engine
with other weights and the same kind of tier. A trial:

1. serves a fresh 100-token prompt A (6 full blocks) and a donor prompt B, so their units are
   written back, then churns the pool until they are all evicted;
2. corrupts the unit of A's block 2 in the tier through the tier's own storage (the DRAM slab's
   reserve/seal, the unit's file, the Redis value), one side at a time, keeping everything else
   consistent (a record changed by the writer is re-signed with the engine's own secret, so the
   check that must catch it is the one the kind is about);
3. serves A again and compares tokens and routes with the oracle's. Detected: the tier counted a
   verification failure and at most A's first two blocks were reloaded (block 2 and after were
   recomputed).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec
import numpy as np

from execstate.engine.sampling_params import SamplingParams
from execstate.identity.checksum import checksum
from execstate.identity.keys import BlockKey
from execstate.identity.scope import CacheScope
from execstate.identity.secret_ring import SecretRing
from execstate.session.lm.llm import LLM
from execstate.state.tiers.disk_store import DiskStore
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.redis_store import RedisStore
from execstate.state.tiers.unit import UnitRecord, pack_unit, sign, unpack_unit
from execstate_bench.desync import TrialResult

SECRET = b"desync-harness-secret-0123456789"
OTHER_SECRET = b"another-writer-secret-0123456789"
OTHER_TENANT = "desync-other-tenant"
BLOCK = 2  # the corrupted unit: blocks before it may be reloaded, it and those after are recomputed
PROMPT_LEN = 100
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
TIER_KINDS = ("kv_other_block", "routes_other_block", "record_other_tokens", "other_weights", "truncated",
              "other_tenant", "forged_unit")

Unit = tuple[UnitRecord, bytes | None, bytes]


class UnitAccess:
    """Reads and overwrites units in one engine's first tier, bypassing first-writer-wins."""

    def __init__(self, llm: LLM) -> None:
        off = llm.engine.offload
        assert off is not None and off.tiers(), "the engine needs an offload tier"
        self.tier = off.tiers()[0]

    def read(self, key: BlockKey) -> Unit:
        t = self.tier
        if isinstance(t, HostCache):
            held = t.acquire(key)
            if held is None:
                raise RuntimeError(f"unit {key.hex()[:16]} is not in DRAM")
            try:
                return held[0], held[1], held[2].tobytes()
            finally:
                t.unpin(key)
        blob = t.get(key)
        if blob is None:
            raise RuntimeError(f"unit {key.hex()[:16]} is not in tier {t.name}")
        record, routes, kv = unpack_unit(blob)
        return record, None if routes is None else bytes(routes), bytes(kv)

    def write(self, key: BlockKey, record: UnitRecord, routes: bytes | None, kv: bytes) -> None:
        t = self.tier
        if isinstance(t, HostCache):
            t.discard(key)
            slot = t.reserve(key)
            if slot is None:
                raise RuntimeError("no free DRAM slot for the injected unit")
            t.view(slot)[:] = np.frombuffer(kv, dtype=np.uint8)
            t.seal(key, record, routes)
            t.unpin(key)
            return
        self.write_raw(key, b"".join(pack_unit(record, routes, kv)))

    def write_raw(self, key: BlockKey, blob: bytes) -> None:
        t = self.tier
        if isinstance(t, DiskStore):
            t.path_of(key).write_bytes(blob)
        elif isinstance(t, RedisStore):
            t.client.set(t.redis_key(key), blob)
        else:
            raise TypeError(f"tier {t.name} keeps no blobs")


class TierDesyncTarget:
    def __init__(self, tier: str, model_dir: Path, other_weights_dir: Path, oracle: LLM, workdir: Path,
                 redis_url: str | None = None, num_kv_blocks: int = 16, seed: int = 0) -> None:
        if tier not in ("dram", "disk", "redis"):
            raise ValueError(f"tier must be dram, disk or redis, got {tier!r}")
        self.name = tier
        self.oracle = oracle
        self.llm = LLM(str(model_dir), **_options(tier, workdir / "target", redis_url, num_kv_blocks))
        self._donor_args = (other_weights_dir, _options(tier, workdir / "donor", redis_url, num_kv_blocks))
        self._donor: LLM | None = None
        self.access = UnitAccess(self.llm)
        self._seeds = itertools.count(seed * 100_000 + 1)

    def kinds(self) -> list[str]:
        routes = self.llm.engine.return_routes
        return [k for k in TIER_KINDS if routes or k != "routes_other_block"]

    def close(self) -> None:
        for llm in (self.llm, self._donor):
            if llm is not None and llm.engine.offload is not None:
                llm.engine.offload.close()

    # -- one trial --------------------------------------------------------------------------------

    def trial(self, kind: str) -> TrialResult:
        a, b = _prompt(next(self._seeds)), _prompt(next(self._seeds))
        llm = self.llm
        _run(llm, a)
        _run(llm, b)
        keys_a, keys_b = _keys(llm, a), _keys(llm, b)
        evict = keys_a + keys_b
        if kind == "other_tenant":
            _run(llm, a, OTHER_TENANT)
            evict += _keys(llm, a, OTHER_TENANT)
        if kind == "other_weights":
            donor = self.donor()
            _run(donor, a)
            _churn(donor, _keys(donor, a))
        _churn(llm, evict)
        self._inject(kind, keys_a[BLOCK], keys_b, a)
        tier = self.access.tier
        before = tier.stats.snapshot().checksum_failures
        out = _run(llm, a)
        caught = tier.stats.snapshot().checksum_failures - before
        assert llm.engine.offload is not None  # the target's engine has tiers
        done = llm.engine.offload.loads.last_done
        used = out.prompt_token_sources["offloaded"] > BLOCK * llm.engine.block_size
        detected = caught >= 1 and not used
        ref = _run(self.oracle, a)
        wrong = out.outputs[0].token_ids != ref.outputs[0].token_ids or _routes(out) != _routes(ref)
        answered = "error" if out.error else ("used" if used else "recompute")
        detail = "; ".join(f"{f.kind}: {f.detail}" for f in (done.failures if done else []))
        return TrialResult(self.name, kind, detected, answered, wrong, detail)

    def donor(self) -> LLM:
        if self._donor is None:
            path, kw = self._donor_args
            self._donor = LLM(str(path), **kw)
        return self._donor

    def _inject(self, kind: str, key: BlockKey, keys_b: list[BlockKey], a: list[int]) -> None:
        acc = self.access
        rec, routes, kv = acc.read(key)
        if kind == "kv_other_block":
            acc.write(key, rec, routes, acc.read(keys_b[BLOCK])[2])
        elif kind == "routes_other_block":
            other = next(r for _, r, _ in (acc.read(k) for k in keys_b) if r != routes)
            acc.write(key, rec, other, kv)
        elif kind == "record_other_tokens":
            tokens = [t + 1 for t in rec.token_ids]
            acc.write(key, sign(msgspec.structs.replace(rec, token_ids=tokens), SecretRing(SECRET)), routes, kv)
        elif kind == "other_weights":
            donor = UnitAccess(self.donor())
            d_rec, d_routes, d_kv = donor.read(_keys(self.donor(), a)[BLOCK])
            acc.write(key, d_rec, d_routes, d_kv)
        elif kind == "other_tenant":
            t_rec, t_routes, t_kv = acc.read(_keys(self.llm, a, OTHER_TENANT)[BLOCK])
            acc.write(key, t_rec, t_routes, t_kv)
        elif kind == "truncated":
            if isinstance(acc.tier, HostCache):  # no file: the route record (or KV) loses its last bytes
                acc.write(key, rec, routes[:-2] if routes else None, kv if routes else kv[:-4])
            else:
                acc.write_raw(key, b"".join(pack_unit(rec, routes, kv))[:-100])
        elif kind == "forged_unit":  # consistent: only the signature tells it from the real unit
            o_rec, o_routes, o_kv = acc.read(keys_b[BLOCK])
            forged = msgspec.structs.replace(rec, kv_checksum=checksum(o_kv),
                                             routes_checksum=None if o_routes is None else checksum(o_routes))
            acc.write(key, sign(forged, SecretRing(OTHER_SECRET)), o_routes, o_kv)
        else:
            raise ValueError(f"tier targets cannot inject {kind!r}")


def _options(tier: str, workdir: Path, redis_url: str | None, num_kv_blocks: int) -> dict:
    kw: dict = dict(enable_return_routed_experts=True, num_kv_blocks=num_kv_blocks, block_size=16, seed=0,
                    offload_secret=SECRET.decode())
    if tier == "dram":
        kw["offload_dram_bytes"] = 256 << 20
    elif tier == "disk":
        kw["offload_disk_dir"] = str(workdir / "disk")
    else:
        if redis_url is None:
            raise ValueError("the redis target needs a redis_url")
        kw["offload_redis_url"] = redis_url
    return kw


def _prompt(seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, PROMPT_LEN).tolist()


def _run(llm: LLM, ids: list[int], salt: str | None = None):
    p: dict = {"prompt_token_ids": ids}
    if salt is not None:
        p["cache_salt"] = salt
    return llm.generate(p, GREEDY, use_tqdm=False)[0]


def _keys(llm: LLM, ids: list[int], salt: str | None = None) -> list[BlockKey]:
    bs = llm.engine.block_size
    return llm.engine.kv_manager.identity(CacheScope.build(salt=salt)).chain(ids, bs)


def _churn(llm: LLM, keys: list[BlockKey]) -> None:
    """Serve filler prompts until no key of ``keys`` is in the pool; wait for the write-backs."""
    pool = llm.engine.block_pool
    for seed in itertools.count(7_000_000):
        if all(pool.lookup(k) is None for k in keys):
            break
        _run(llm, _prompt(seed))
    off = llm.engine.offload
    assert off is not None and off.flush()


def _routes(out) -> bytes | None:
    r = out.outputs[0].routed_experts
    return None if r is None else r.tobytes()
