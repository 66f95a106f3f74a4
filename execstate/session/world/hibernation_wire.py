"""A hibernated world session as it is stored: one signed, checksummed unit (docs/offload.md
"Hibernation"; docs/offload.md).

- :class:`WorldHibernation`: the session's state when it went to sleep: the world migration offer
  (``session/world/migration_wire.py``: carry, noise generator state, prompt and version, held
  key, history key, step index, event epochs, branch id, seed, the event queue with its pending
  events), without its chunks, plus every distinct chunk the session held (its window's K/V and
  its checkpoints' and origin's, each stored once with its sha256), the block table of the live
  state and of each live checkpoint (then the origin) as indices into those chunks, the owner's
  tenant and the session state key (``identity/session_keys.py``) it had.
- The blob is the envelope of the migration wire (``session/runtime/migration_wire.py``) under its
  own domain, always signed (``HMAC-SHA256``: a ``World``'s hibernation secret); a unit written
  by another tenant's session, another session or another ``World``'s secret never verifies as
  this session's (``session/world/hibernation.py`` checks which).
- :func:`unit_key`: where the unit lives in a tier (a ``UnitStore`` of ``state/tiers/``): the
  sha256 of the domain, the tenant, the session id, the state key and the blob's own sha256: the
  key names the content and the session's identity.

Decoding checks types and bounds (``MigrationError("invalid")``), the signature
(``unauthorized``) and the format version (``incompatible``); the semantic checks are the waker's.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from execstate.identity.keys import BlockKey
from execstate.identity.secret_ring import SecretRing
from execstate.session.runtime.migration import MigrationError
from execstate.session.runtime.migration_wire import open_envelope, seal
from execstate.session.world.migration_wire import MAX_CHUNKS, MAX_OFFER_BYTES, WireChunk, WorldOffer

FORMAT_VERSION = 1
DOMAIN = b"execstate/v1/hibernated-world-session\x00"
MAX_TABLES = 1024

_Index = Annotated[int, Meta(ge=0, lt=MAX_CHUNKS * MAX_TABLES)]
_Table = Annotated[list[_Index], Meta(max_length=MAX_CHUNKS)]


class WorldHibernation(Struct, frozen=True, forbid_unknown_fields=True):
    """A hibernated world session (module docstring)."""

    format_version: int
    tenant: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    state_key: Annotated[bytes, Meta(min_length=32, max_length=32)]
    offer: WorldOffer  # its ``chunks`` empty: they are in ``chunks`` below
    chunks: Annotated[list[WireChunk], Meta(max_length=MAX_CHUNKS * MAX_TABLES)]
    live: _Table
    saved: Annotated[list[_Table], Meta(max_length=MAX_TABLES)]  # live checkpoints in order, then the origin


def digest(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


def unit_key(tenant: str, session_id: str, state_key: bytes, blob_digest: bytes) -> BlockKey:
    """The unit's key in a tier (module docstring)."""
    h = hashlib.sha256(DOMAIN)
    for part in (tenant.encode(), session_id.encode(), state_key, blob_digest):
        h.update(len(part).to_bytes(4, "little"))
        h.update(part)
    return BlockKey(h.digest())


def encode_hibernation(h: WorldHibernation, secret: SecretRing) -> bytes:
    return seal(msgspec.msgpack.encode(h), secret, DOMAIN)


def decode_hibernation(data: bytes, secret: SecretRing) -> WorldHibernation:
    payload, _ = open_envelope(data, secret, DOMAIN, what="hibernated world session", max_bytes=MAX_OFFER_BYTES,
                               require_signature=True, no_secret="the World has no hibernation secret")
    try:
        h = msgspec.msgpack.decode(payload, type=WorldHibernation)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MigrationError("invalid", f"malformed hibernated world session: {e}") from None
    if h.format_version != FORMAT_VERSION:
        raise MigrationError("incompatible", f"hibernated world session format {h.format_version}, this World reads "
                             f"{FORMAT_VERSION}")
    n = len(h.chunks)
    if any(i >= n for t in [h.live, *h.saved] for i in t):
        raise MigrationError("invalid", "hibernated world session: a block table names a chunk it does not hold")
    return h
