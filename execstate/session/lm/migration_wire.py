"""The control state of a migrating LM session, as it travels (docs/contracts.md 5, 6).

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
  Unix time after which the target must not create the session (the source has given up), which
  is also the offer's expiry. Since format 2 (docs/security.md): the owning ``tenant`` (the target
  creates the session under it), a single-use ``nonce`` and the ``target_engine_id`` the offer
  is for (the target refuses an offer for another engine, and a nonce it has seen:
  ``serve/sessions/handover.py``). The structured-output matcher state (``grammar``: the
  constraint's wire text and the tokens the matcher accepted, replayed by the target; ``None``
  when the output is not constrained).
- **Signature**: ``HMAC-SHA256(secret, DOMAIN + payload)`` in hex over the exact payload bytes,
  with the shared secret of the instances (``identity/secret_ring.py``: during a rotation the
  previous secret verifies too). **Every offer must be signed**: an unsigned or wrongly signed
  offer is refused (``unauthorized``) before its contents are read. An allow-list of prefill
  engines (``allowed_prefill_engines``) never stands in for a signature: it is for PD KV
  handoffs only, where the decode instance dials the listed address itself.
- **Decoding** (:func:`decode_offer`) checks types and bounds (a malformed, oversized or
  unknown-field message is ``MigrationError("invalid")``); the semantic checks against the
  receiving model are in ``session/lm/migration_state.py``.

The pending events and the envelope are the kind-agnostic wire parts
(``session/runtime/migration_wire.py``), shared with the world kind's offer.

Errors of a migration are :class:`MigrationError` with a ``code``: ``invalid``, ``unauthorized``,
``incompatible``, ``capacity``, ``conflict`` (the id is open on the target), ``timeout``,
``unsupported`` (no PD connector of the needed role), ``route_mismatch`` (the manifest's route
records differ from the control state's: a desync), ``cancelled``, ``internal``, ``unreachable``
(the source could not reach the target), ``refused`` (the target answered with an error the
source could not classify), or a transfer ``ErrorCode`` value
(``checksum_mismatch``, ``truncated``, ``stale_transfer_id``, ``released``, ...).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from execstate.identity.scope import MAX_CACHE_SALT_CHARS
from execstate.identity.secret_ring import SecretRing
from execstate.session.runtime.migration import MigrationError
from execstate.session.runtime.migration_wire import (
    MAX_EVENTS,
    SignedEnvelope,
    WireAck,
    WireEvents,
    WirePending,
    open_envelope,
    seal,
)

__all__ = ["DOMAIN", "FORMAT_VERSION", "MAX_EVENTS", "MAX_OFFER_BYTES", "MAX_RNG_BYTES", "MAX_TOKENS", "MigrationError",
           "SessionOffer", "SignedOffer", "WireAck", "WireEvents", "WireGrammar", "WirePending", "WireSampling",
           "decode_offer",
           "encode_offer", "sign"]

FORMAT_VERSION = 2
DOMAIN = b"execstate/v1/session-offer\x00"
MAX_OFFER_BYTES = 64 << 20
MAX_TOKENS = 1 << 20
MAX_RNG_BYTES = 1 << 16

_Count = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
_Name = Annotated[str, Meta(min_length=1, max_length=256)]
_SessionId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
_Tenant = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
_Nonce = Annotated[str, Meta(pattern=r"^[0-9a-f]{32,128}$")]
_Token = Annotated[int, Meta(ge=0, le=(1 << 31) - 1)]

SignedOffer = SignedEnvelope
"""The envelope: the offer's msgpack bytes and their HMAC (hex), None when unsigned."""


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
    structured_outputs: Annotated[str, Meta(max_length=1 << 20)] | None = None  # StructuredOutputsParams.to_wire
    return_hidden: bool = False


class WireGrammar(Struct, frozen=True, forbid_unknown_fields=True):
    """A structured-output matcher's state (``engine/grammar/matcher.GrammarSnapshot``)."""

    spec: Annotated[str, Meta(max_length=1 << 20)]
    token_ids: Annotated[list[_Token], Meta(max_length=MAX_TOKENS)]


class SessionOffer(Struct, frozen=True, forbid_unknown_fields=True):
    """A session's control state (module docstring)."""

    format_version: int
    session_id: _SessionId
    tenant: _Tenant
    nonce: _Nonce
    target_engine_id: _Name
    source_instance_id: _Name
    provenance_digest: _Name
    cache_salt: Annotated[str, Meta(min_length=1, max_length=MAX_CACHE_SALT_CHARS)] | None
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
    grammar: WireGrammar | None = None


def sign(secret: SecretRing, payload: bytes) -> str:
    return secret.sign(DOMAIN, payload)


def encode_offer(offer: SessionOffer, secret: SecretRing | None) -> bytes:
    """The envelope's bytes (signed when ``secret`` is given; a target refuses it unsigned)."""
    return seal(msgspec.msgpack.encode(offer), secret, DOMAIN)


def decode_offer(data: bytes, secret: SecretRing | None) -> tuple[SessionOffer, bool]:
    """The offer in ``data``, its signature verified (the ``bool`` is always True: kept for callers).

    ``MigrationError``: ``unauthorized`` (unsigned, a signature that does not verify, or no secret
    on this side to check one: checked before anything else is read), ``invalid`` (malformed,
    oversized, unknown fields, violated bounds), ``incompatible`` (another format version).
    """
    payload, signed = open_envelope(data, secret, DOMAIN, what="session offer", max_bytes=MAX_OFFER_BYTES,
                                    require_signature=True,
                                    no_secret="this instance has no shared secret (kv_secret / EXECSTATE_KV_SECRET)")
    try:
        version = msgspec.msgpack.decode(payload, type=_Version).format_version
        if version != FORMAT_VERSION:
            raise MigrationError(
                "incompatible", f"session offer format {version}, this instance reads {FORMAT_VERSION}"
            )
        offer = msgspec.msgpack.decode(payload, type=SessionOffer)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MigrationError("invalid", f"malformed session offer: {e}") from None
    return offer, signed


class _Version(Struct, frozen=True):
    format_version: int
