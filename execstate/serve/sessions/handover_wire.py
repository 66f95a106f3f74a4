"""The server-to-server calls of a session hand-over, signed with the shared secret (docs/security.md).

Besides the session offer itself (``session/lm/migration_wire.py``), a hand-over uses three
calls from the source to the target, all ``POST`` with an ``application/msgpack`` body that is a
signed envelope (``session/runtime/migration_wire.py``) of a :class:`HandoverRequest`, each kind
under its own domain tag, so no signature made for one call is valid for another:

- ``identify``: which engine is at this URL (a target listed by URL only: ``targets.py``);
- ``commit``: the source closed its copy; the target serves the session from now on;
- ``abort``: the source never got the acknowledgement; the target drops what it imported and
  refuses any later commit (and a late offer) for that nonce.

Every request names the ``nonce`` of the hand-over, its ``expires_at`` (the offer's expiry) and
the engine it is for (``target_engine_id``; empty for ``identify``): the target refuses one for
another engine. Answers are JSON whose ``signature`` is the HMAC, under the answer's own domain,
of (call, nonce, outcome) (:func:`answer_signature`): the source acts on an answer (closes its
copy on an import's acknowledgement, resumes on an abort's) only when it verifies. No bearer
key travels between the instances: a source never forwards its client's API key.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from execstate.identity.secret_ring import SecretRing
from execstate.session.runtime.migration import MigrationError
from execstate.session.runtime.migration_wire import open_envelope, seal

CALLS = ("identify", "commit", "abort")
IMPORTED = "imported"  # the outcome acknowledged by an import's answer
MAX_REQUEST_BYTES = 4096
_ANSWER_DOMAIN = b"execstate/v1/handover-answer\x00"

Nonce = Annotated[str, Meta(pattern=r"^[0-9a-f]{32,128}$")]


class HandoverRequest(Struct, frozen=True, forbid_unknown_fields=True):
    nonce: Nonce
    target_engine_id: Annotated[str, Meta(max_length=256)]
    session_id: Annotated[str, Meta(max_length=128)]
    expires_at: float


def _domain(call: str) -> bytes:
    if call not in CALLS:
        raise ValueError(f"unknown hand-over call {call!r}")
    return f"execstate/v1/handover-{call}\x00".encode()


def seal_request(call: str, req: HandoverRequest, ring: SecretRing) -> bytes:
    return seal(msgspec.msgpack.encode(req), ring, _domain(call))


def open_request(call: str, data: bytes, ring: SecretRing | None) -> HandoverRequest:
    """The request in ``data``; ``unauthorized`` unless signed with an accepted secret, ``invalid``
    when malformed."""
    payload, _ = open_envelope(data, ring, _domain(call), what=f"hand-over {call}", max_bytes=MAX_REQUEST_BYTES,
                               require_signature=True,
                               no_secret="this instance has no shared secret (kv_secret / EXECSTATE_KV_SECRET)")
    try:
        return msgspec.msgpack.decode(payload, type=HandoverRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MigrationError("invalid", f"malformed hand-over {call}: {e}") from None


def _answer(call: str, nonce: str, outcome: str) -> bytes:
    return "\x00".join((call, nonce, outcome)).encode()


def answer_signature(ring: SecretRing, call: str, nonce: str, outcome: str) -> str:
    """The ``signature`` of the target's answer to ``call`` for ``nonce``: ``outcome`` is
    ``imported`` (an offer), the engine id (``identify``), ``committed`` or ``aborted``."""
    return ring.sign(_ANSWER_DOMAIN, _answer(call, nonce, outcome))


def answer_verifies(ring: SecretRing, call: str, nonce: str, outcome: str, signature: object) -> bool:
    return ring.verify(_ANSWER_DOMAIN, _answer(call, nonce, outcome), signature)
