"""Deprecated path: moved to ``execstate.session.world.migration_wire`` (issue 18); this shim goes in the next
release."""

from execstate.session._moved import moved
from execstate.session.world.migration_wire import (  # noqa: F401
    DOMAIN,
    FORMAT_VERSION,
    MAX_CHUNKS,
    MAX_OFFER_BYTES,
    SignedWorldOffer,
    WireChunk,
    WireHeld,
    WorldOffer,
    chunk_digest,
    decode_world_offer,
    encode_world_offer,
)

__all__ = [
    "DOMAIN",
    "FORMAT_VERSION",
    "MAX_CHUNKS",
    "MAX_OFFER_BYTES",
    "SignedWorldOffer",
    "WireChunk",
    "WireHeld",
    "WorldOffer",
    "chunk_digest",
    "decode_world_offer",
    "encode_world_offer",
]

moved("execstate.session.world_migration_wire", "execstate.session.world.migration_wire")
