"""KV cache events in vLLM's shape, keyed by execution-state block keys (docs/fleet.md).

What a replica tells the world about its cache, so a router can keep an index of it without
asking: a :class:`KVEventBatch` (a timestamp, its events, the data-parallel rank) of

- :class:`BlockStored`: blocks that became findable in a tier, as one chain (``block_hashes``
  in order, ``parent_block_hash`` the key before the first: the provenance root for a prompt's
  first block), with their ``token_ids`` (``block_size`` per block);
- :class:`BlockRemoved`: blocks no longer findable in that tier;
- :class:`AllBlocksCleared`: forget everything this replica said before (sent first by every
  publisher, so a subscriber of a restarted replica drops its stale index).

The field order and encoding (msgpack arrays, each event tagged by its class name) are vLLM's
(``vllm/distributed/kv_events.py``), so a subscriber written for vLLM decodes them; execstate's
fields come after vLLM's (a decoder that does not know them ignores trailing fields):

- ``block_hashes`` are execstate's 32-byte block keys (``identity/keys.py``). They chain from the
  provenance root (model, **weights version**, dtype, numerics, route mode, tenant cache salt),
  so equal keys mean execution-compatible state and a key of another version or salt never
  equals the key a request computes;
- ``medium`` is the tier: ``pool`` (the KV pool), ``dram``, ``disk``, ``shared`` (a store other
  replicas can read, e.g. Redis) (:data:`MEDIUMS`);
- ``weights_version`` (on ``BlockStored``): the version the blocks were computed under.

Pure Python (msgspec only): the router and the tests decode with these classes, no engine needed.
"""

from __future__ import annotations

from typing import Any

import msgspec

POOL, DRAM, DISK, SHARED = "pool", "dram", "disk", "shared"
MEDIUMS = (POOL, DRAM, DISK, SHARED)


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the three events (tagged by class name, as vLLM's)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = POOL
    weights_version: str | None = None  # execstate: the provenance's weights version


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes]
    medium: str | None = POOL


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes | memoryview) -> KVEventBatch:
    """``msgspec.DecodeError`` (a ``ValueError``) on anything that is not a batch."""
    return _decoder.decode(payload)


def to_dict(event: KVCacheEvent) -> dict[str, Any]:
    """One event as a dict with its type (logs, debugging)."""
    return {"type": type(event).__name__, **msgspec.structs.asdict(event)}
