"""A hibernated LM session as it is stored, and a reference to wake it elsewhere (docs/offload.md
"Hibernation"; docs/security.md; docs/offload.md).

- :class:`HibernationManifest`: the session's control state, the same :class:`SessionOffer` a
  migration sends (``session/lm/migration_wire.py``: token ids, route rows, step index, epochs,
  branch id, seed and RNG state, sampling parameters, priority, pending events and
  acknowledgements, the grammar matcher's snapshot, tenant, provenance digest; no handoff: its KV
  is in the tiers), plus the keys of its units in chain order (its full blocks, written to the
  tiers under their execution-state keys) and its session state key
  (``identity/session_keys.py``: the block chain, the tail tokens, the step index, the event
  epoch and the branch id). Wrapped in the signed envelope of the migration wire under its own
  domain; in the shared tier (Redis: ``state/tiers/manifest_store.py``) it must be signed.
- :class:`HibernationReference`: what another engine needs to wake the session from the shared
  tier: the manifest's Redis key and, when known, its digest (sha256 of the stored bytes) and
  state key; bound to a target engine id, a single-use nonce and the session's tenant, with an
  expiry. Always signed with the instances' shared secret (as migration offers are).

Decoding checks types and bounds (``MigrationError("invalid")``), the signature
(``unauthorized``) and the format version (``incompatible``); the semantic checks are the waker's
(``session/lm/hibernation.py``).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, TypeVar

import msgspec
from msgspec import Meta, Struct

from execstate.identity.secret_ring import SecretRing
from execstate.session.lm.migration_wire import MAX_OFFER_BYTES, SessionOffer
from execstate.session.runtime.migration import MigrationError
from execstate.session.runtime.migration_wire import open_envelope, seal

__all__ = ["FORMAT_VERSION", "HibernationManifest", "HibernationReference", "decode_manifest", "decode_reference",
           "digest", "encode_manifest", "encode_reference"]

FORMAT_VERSION = 1
MANIFEST_DOMAIN = b"execstate/v1/hibernated-session\x00"
REFERENCE_DOMAIN = b"execstate/v1/hibernation-reference\x00"
MAX_REFERENCE_BYTES = 4096
MAX_UNITS = 1 << 16

_Name = Annotated[str, Meta(min_length=1, max_length=256)]
_Key = Annotated[bytes, Meta(min_length=32, max_length=32)]
T = TypeVar("T")


class HibernationManifest(Struct, frozen=True, forbid_unknown_fields=True):
    """A hibernated session (module docstring)."""

    format_version: int
    engine_id: _Name  # the engine that hibernated it
    offer: SessionOffer
    unit_keys: Annotated[list[_Key], Meta(max_length=MAX_UNITS)]
    state_key: _Key
    hibernated_at: float


class HibernationReference(Struct, frozen=True, forbid_unknown_fields=True):
    """A signed pointer to a hibernated session in the shared tier (module docstring)."""

    format_version: int
    manifest_key: Annotated[str, Meta(min_length=1, max_length=1024)]
    session_id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
    tenant: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    target_engine_id: _Name
    nonce: Annotated[str, Meta(pattern=r"^[0-9a-f]{32,128}$")]
    expires_at: float
    manifest_digest: _Key | None = None
    state_key: _Key | None = None


def digest(data: bytes) -> bytes:
    """sha256 of a stored manifest's bytes (a reference names the exact manifest)."""
    return hashlib.sha256(data).digest()


def encode_manifest(m: HibernationManifest, secret: SecretRing | None) -> bytes:
    return seal(msgspec.msgpack.encode(m), secret, MANIFEST_DOMAIN)


def decode_manifest(data: bytes, secret: SecretRing | None, require_signature: bool) -> HibernationManifest:
    payload, _ = open_envelope(data, secret, MANIFEST_DOMAIN, what="hibernated session manifest",
                               max_bytes=MAX_OFFER_BYTES, require_signature=require_signature,
                               no_secret="this engine has no offload secret (offload_secret / EXECSTATE_KV_SECRET)")
    return _decode(payload, HibernationManifest, "manifest")


def encode_reference(r: HibernationReference, secret: SecretRing) -> bytes:
    return seal(msgspec.msgpack.encode(r), secret, REFERENCE_DOMAIN)


def decode_reference(data: bytes, secret: SecretRing | None) -> HibernationReference:
    payload, _ = open_envelope(data, secret, REFERENCE_DOMAIN, what="hibernation reference",
                               max_bytes=MAX_REFERENCE_BYTES, require_signature=True,
                               no_secret="this engine has no shared secret (offload_secret / EXECSTATE_KV_SECRET)")
    return _decode(payload, HibernationReference, "reference")


def _decode(payload: bytes, type_: type[T], what: str) -> T:
    try:
        version = msgspec.msgpack.decode(payload, type=_Version).format_version
        if version != FORMAT_VERSION:
            raise MigrationError("incompatible", f"hibernation {what} format {version}, this engine reads "
                                 f"{FORMAT_VERSION}")
        return msgspec.msgpack.decode(payload, type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MigrationError("invalid", f"malformed hibernation {what}: {e}") from None


class _Version(Struct, frozen=True):
    format_version: int
