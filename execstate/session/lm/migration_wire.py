"""The control state of a migrating LM session, as it travels (docs/ARCHITECTURE.md 5, 6).

Migration is the PD transfer protocol applied to a session: the session's full KV blocks go
through the source's ``KVExporter`` (manifest on the ZeroMQ control channel, KV bytes over NIXL,
verified by the target's ``KVImporter``), and everything else the session owns travels as one
:class:`SessionOffer`: a typed ``msgspec`` message encoded as msgpack (never pickle), inside a
:class:`SignedOffer` envelope.

- **Contents**: session id, source instance, provenance digest, cache salt, the context's token
  ids, how many of them have KV at the source, the route rows of the whole context (int16
  little-endian ``[len(token_ids) - 1, n_moe_layers, top_k]``, C order), step index, event epoch
  (and the highest epoch the session had), branch id, seed and RNG state, sampling parameters,
  scheduling priority, pending events with the id watermark and remembered acknowledgements, the
  PD handoff of the exported blocks (``None`` when nothing was exported) and ``commit_by``: a
  Unix time after which the target must not create the session (the source has given up).
- **Signature**: ``HMAC-SHA256(secret, DOMAIN + payload)`` in hex over the exact payload bytes,
  with the PD handoff secret (``transfer/handoff.py``) shared by both instances. A wrongly signed
  offer is refused; an unsigned one is accepted only with an unsigned handoff naming a source
  engine in the target's allow-list (``allowed_prefill_engines``, as for PD: the KV is then read
  from the listed address), never with a signed handoff lifted from another offer.
- **Decoding** (:func:`decode_offer`) checks types and bounds (a malformed, oversized or
  unknown-field message is ``MigrationError("invalid")``); the semantic checks against the
  receiving model are in ``session/migration_state.py``.

Errors of a migration are :class:`MigrationError` with a ``code``: ``invalid``, ``unauthorized``,
``incompatible``, ``capacity``, ``conflict`` (the id is open on the target), ``timeout``,
``unsupported`` (no PD connector of the needed role), ``route_mismatch`` (the manifest's route
records differ from the control state's: a desync), ``cancelled``, ``internal``, ``unreachable``
(the source could not reach the target), ``refused`` (the target answered with an error the
source could not classify), or a transfer ``ErrorCode`` value
(``checksum_mismatch``, ``truncated``, ``stale_transfer_id``, ``released``, ...).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from execstate.session.events import SessionEventError

FORMAT_VERSION = 1
DOMAIN = b"execstate/v1/session-offer\x00"
MAX_OFFER_BYTES = 64 << 20
MAX_TOKENS = 1 << 20
MAX_EVENTS = 4096
MAX_RNG_BYTES = 1 << 16

_Count = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
_Name = Annotated[str, Meta(min_length=1, max_length=256)]
_SessionId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
_Token = Annotated[int, Meta(ge=0, le=(1 << 31) - 1)]


class MigrationError(SessionEventError):
    """A migration failed or was refused; ``code`` says why (module docstring). The source
    session is unchanged and serving; the target holds nothing of it. A refusal by the session
    itself (``busy``, ``failed``, ``closed``, ``not_found``, ``stale_state``) keeps its code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)


class WireSampling(Struct, frozen=True, forbid_unknown_fields=True):
    """The session's ``SamplingParams`` (the per-step fields are set by each step)."""

    temperature: float
    top_p: float
    top_k: int | None
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    logit_bias: dict[int, float] | None
    max_tokens: int | None
    min_tokens: int
    stop: list[str] | None
    stop_token_ids: list[int] | None
    ignore_eos: bool
    logprobs: int | None
    skip_special_tokens: bool


class WirePending(Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One pending event as its client submitted it (a composite as ``{"events": [...]}``); the
    target validates it again with its own event kinds."""

    event_id: _Count
    kind: _Name
    data: Any


class WireAck(Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    event_id: _Count
    kind: _Name
    status: _Name


class WireEvents(Struct, frozen=True, forbid_unknown_fields=True):
    pending: Annotated[list[WirePending], Meta(max_length=MAX_EVENTS)]
    last_event_id: _Count | None
    acks: Annotated[list[WireAck], Meta(max_length=MAX_EVENTS)]


class SessionOffer(Struct, frozen=True, forbid_unknown_fields=True):
    """A session's control state (module docstring)."""

    format_version: int
    session_id: _SessionId
    source_instance_id: _Name
    provenance_digest: _Name
    cache_salt: Annotated[str, Meta(max_length=4096)] | None
    token_ids: Annotated[list[_Token], Meta(max_length=MAX_TOKENS)]
    num_kv_tokens: _Count
    route_rows: bytes | None
    step_index: _Count
    event_epoch: _Count
    max_event_epoch: _Count
    branch_id: _Name
    seed: int  # checked as SamplingParams.seed (engine/validation.py: SEED_RANGE)
    rng_state: Annotated[bytes, Meta(max_length=MAX_RNG_BYTES)]
    sampling: WireSampling
    priority: Annotated[int, Meta(ge=-(1 << 31), le=(1 << 31) - 1)]
    events: WireEvents
    handoff: dict[str, Any] | None
    commit_by: float


class SignedOffer(Struct, frozen=True, forbid_unknown_fields=True):
    """The envelope: the offer's msgpack bytes and their HMAC (hex), None when unsigned."""

    payload: bytes
    signature: Annotated[str, Meta(min_length=64, max_length=64)] | None


def sign(secret: bytes, payload: bytes) -> str:
    return hmac.new(secret, DOMAIN + payload, hashlib.sha256).hexdigest()


def encode_offer(offer: SessionOffer, secret: bytes | None) -> bytes:
    """The envelope's bytes (signed when ``secret`` is given)."""
    payload = msgspec.msgpack.encode(offer)
    return msgspec.msgpack.encode(SignedOffer(payload, None if secret is None else sign(secret, payload)))


def decode_offer(data: bytes, secret: bytes | None) -> tuple[SessionOffer, bool]:
    """The offer in ``data`` and whether its signature verified (module docstring).

    ``MigrationError``: ``invalid`` (malformed, oversized, unknown fields, violated bounds, another
    format version) or ``unauthorized`` (a signature that does not verify, or one this side has no
    secret to check). An unsigned offer decodes with ``False``; the caller decides whether its
    handoff is trusted without one.
    """
    if len(data) > MAX_OFFER_BYTES:
        raise MigrationError("invalid", f"a session offer of {len(data)} bytes (at most {MAX_OFFER_BYTES})")
    try:
        env = msgspec.msgpack.decode(data, type=SignedOffer)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MigrationError("invalid", f"malformed session offer envelope: {e}") from None
    signed = env.signature is not None
    if signed:
        if secret is None:
            raise MigrationError("unauthorized", "the session offer is signed but this instance has no handoff "
                                 "secret (kv_secret / EXECSTATE_KV_SECRET)")
        if not hmac.compare_digest(env.signature or "", sign(secret, env.payload)):
            raise MigrationError("unauthorized", "the session offer's signature does not match (tampered, or "
                                 "another secret)")
    try:
        offer = msgspec.msgpack.decode(env.payload, type=SessionOffer)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MigrationError("invalid", f"malformed session offer: {e}") from None
    if offer.format_version != FORMAT_VERSION:
        raise MigrationError("incompatible", f"session offer format {offer.format_version}, "
                             f"this instance reads {FORMAT_VERSION}")
    return offer, signed
