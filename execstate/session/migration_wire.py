"""Deprecated path: moved to ``execstate.session.lm.migration_wire`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.migration_wire import (  # noqa: F401
    DOMAIN,
    FORMAT_VERSION,
    MAX_EVENTS,
    MAX_OFFER_BYTES,
    MAX_RNG_BYTES,
    MAX_TOKENS,
    MigrationError,
    SessionOffer,
    SignedOffer,
    WireAck,
    WireEvents,
    WirePending,
    WireSampling,
    decode_offer,
    encode_offer,
    sign,
)

__all__ = [
    "DOMAIN",
    "FORMAT_VERSION",
    "MAX_EVENTS",
    "MAX_OFFER_BYTES",
    "MAX_RNG_BYTES",
    "MAX_TOKENS",
    "MigrationError",
    "SessionOffer",
    "SignedOffer",
    "WireAck",
    "WireEvents",
    "WirePending",
    "WireSampling",
    "decode_offer",
    "encode_offer",
    "sign",
]

moved("execstate.session.migration_wire", "execstate.session.lm.migration_wire")
