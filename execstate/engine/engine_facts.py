"""What the layers above may read of an engine: immutable snapshots, built on the engine thread.

Contract: every ``*_of`` function here takes the ``LLMEngine``, must run on the engine thread
(``AsyncEngine`` runs it through its command queue: ``AsyncEngine.summary``, ``load``,
``weights_version``, ``peer``, ``home``), only reads, and returns frozen values that any thread
may keep and read. The serving, fleet and session layers read the engine through these and the
``AsyncEngine`` methods, never through its attributes (docs/ARCHITECTURE.md, the layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from execstate.engine.config import EngineConfig
from execstate.identity.provenance import Provenance
from execstate.identity.secret_ring import SecretRing
from execstate.model.config import ModelConfig
from execstate.state.tiers.stats import TierSnapshot

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine

LOCAL_ENGINE_ID = "local"  # an engine with neither a PD connector nor offload tiers: nothing is shared


@dataclass(frozen=True)
class EngineHome:
    """Where this engine's shared state is named. ``engine_id``: the id in manifests and
    hibernation references (its PD instance id, else its offload connector's, else
    :data:`LOCAL_ENGINE_ID`); ``shared_tier``: a shared tier (Redis manifests) is attached."""

    engine_id: str
    shared_tier: bool


@dataclass(frozen=True)
class PeerCredentials:
    """What a hand-over between instances is checked with: the PD connector's instance id and its
    shared secret ring (``None``: the instance has no secret, so it signs and accepts nothing)."""

    instance_id: str
    secrets: SecretRing | None


@dataclass(frozen=True)
class EngineLoad:
    """The engine's gauges at one moment (``/metrics``, the fleet router's routing stats)."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_usage: float  # kv_blocks_used / kv_blocks_total, in [0, 1]
    prefix_cache_hit_rate: float
    prefix_hit_tokens: int
    prefix_lookup_tokens: int
    provenance: Provenance
    offload: tuple[TierSnapshot, ...] = ()


@dataclass(frozen=True)
class KVEventsFeed:
    """Where the engine publishes its KV events and what they tell."""

    endpoint: str
    replay_endpoint: str | None
    secured: bool  # CURVE with keys of the shared secret; else loopback only
    include_token_ids: bool
    exclude_tenants: frozenset[str]


@dataclass(frozen=True)
class EngineSummary:
    """What an engine was built with (the server's start-up log; a replica's registration)."""

    model_path: Path
    model_config: ModelConfig
    config: EngineConfig
    num_parameters: int  # shared (tied) tensors counted once
    uses_cpu_kernels: bool
    kv_num_blocks: int
    kv_block_size: int
    kv_bytes: int  # K and V of every layer
    max_model_len: int
    return_routes: bool
    provenance: Provenance
    startup_seconds: float
    home: EngineHome
    pd_instance_id: str | None  # None: no PD connector
    pd_control_addr: str | None  # the PD control channel (a producer's), else None
    offload_tiers: tuple[TierSnapshot, ...] | None  # None: no offload tiers
    offload_shared_secret: bool  # units signed with the shared secret (else a per-process key)
    kv_events: KVEventsFeed | None


def home_of(engine: LLMEngine) -> EngineHome:
    if engine.pd is not None:
        eid = engine.pd.instance_id
    else:
        eid = engine.offload.instance_id if engine.offload is not None else LOCAL_ENGINE_ID
    off = engine.offload
    return EngineHome(eid, off is not None and off.manifests is not None)


def peer_of(engine: LLMEngine) -> PeerCredentials | None:
    """``None`` without a PD connector (the instance can neither send nor receive sessions)."""
    pd = engine.pd
    return PeerCredentials(pd.instance_id, pd.secrets) if pd is not None else None


def weights_version_of(engine: LLMEngine) -> str:
    return engine.provenance.weights_version


def load_of(engine: LLMEngine) -> EngineLoad:
    sched, pool, kv = engine.scheduler, engine.block_pool, engine.kv_manager
    return EngineLoad(
        num_running=len(sched.running), num_waiting=len(sched.waiting), kv_blocks_used=pool.num_used,
        kv_blocks_total=pool.num_blocks, kv_usage=pool.usage, prefix_cache_hit_rate=kv.prefix_hit_rate,
        prefix_hit_tokens=kv.num_hit_tokens, prefix_lookup_tokens=kv.num_lookup_tokens,
        provenance=engine.provenance,
        offload=tuple(engine.offload.snapshot()) if engine.offload is not None else (),
    )


def kv_events_of(engine: LLMEngine) -> KVEventsFeed | None:
    ev = engine.kv_events
    if ev is None:
        return None
    pub = ev.publisher
    return KVEventsFeed(pub.endpoint, pub.replay_endpoint, pub.secured, ev.include_token_ids, ev.exclude_tenants)


def summary_of(engine: LLMEngine) -> EngineSummary:
    pool, pd, off = engine.kv_pool, engine.pd, engine.offload
    return EngineSummary(
        model_path=Path(engine.model_path), model_config=engine.model_config, config=engine.config,
        num_parameters=sum(p.numel() for p in engine.model.parameters()),
        uses_cpu_kernels=bool(engine.model.kernels), kv_num_blocks=pool.num_blocks, kv_block_size=pool.block_size,
        kv_bytes=pool.k.nbytes + pool.v.nbytes, max_model_len=engine.max_model_len,
        return_routes=engine.return_routes, provenance=engine.provenance, startup_seconds=engine.startup_seconds,
        home=home_of(engine), pd_instance_id=pd.instance_id if pd is not None else None,
        pd_control_addr=pd.server.addr if pd is not None and pd.server is not None else None,
        offload_tiers=tuple(off.snapshot()) if off is not None else None,
        offload_shared_secret=off is not None and off.shared_ring is not None,
        kv_events=kv_events_of(engine),
    )
