"""The one secret ring of the project: every signature is made and checked here. Pure Python.

KV handoffs, migration offers, the hand-over calls, hibernated state and offload-tier units are
signed with HMAC-SHA256 under a secret the servers share. A :class:`SecretRing` holds the *current* secret,
which signs, and the *previous* ones still accepted during a rotation. Rotate in three rolling
steps, one server at a time in each, so that every server always accepts what every other signs:

1. ``EXECSTATE_KV_SECRET=old``, ``EXECSTATE_KV_SECRET_PREVIOUS=new``: every server accepts the new
   secret (and still signs with the old one);
2. ``EXECSTATE_KV_SECRET=new``, ``EXECSTATE_KV_SECRET_PREVIOUS=old``: every server signs with the
   new secret (the old one is still accepted from servers not yet restarted);
3. ``EXECSTATE_KV_SECRET=new`` alone.

A process without a configured secret still signs what it keeps for itself (a DRAM or disk
tier's units) under :meth:`SecretRing.ephemeral`: a random key that lives and dies with the
process, so such a unit is readable by the process that wrote it and by no other writer.

Every signature covers a domain tag (``execstate/v1/...`` + NUL) so a signature made for one kind
of message is never valid for another. Verification compares in constant time
(``hmac.compare_digest``) against each accepted secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field

SECRET_ENV = "EXECSTATE_KV_SECRET"
PREVIOUS_ENV = "EXECSTATE_KV_SECRET_PREVIOUS"
MIN_SECRET_BYTES = 16
MAX_PREVIOUS = 4


def _raw(value: str | bytes, what: str) -> bytes:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"{what} must be at least {MIN_SECRET_BYTES} bytes, got {len(raw)}")
    return raw


@dataclass(frozen=True)
class SecretRing:
    """``current`` signs; ``current`` and every ``previous`` secret verify. Immutable, any thread."""

    current: bytes = field(repr=False)
    previous: tuple[bytes, ...] = field(default=(), repr=False)
    shared: bool = True  # False: a per-process key (:meth:`ephemeral`), no other process knows it

    def __post_init__(self) -> None:
        _raw(self.current, "the current secret")
        if len(self.previous) > MAX_PREVIOUS:
            raise ValueError(f"at most {MAX_PREVIOUS} previous secrets are accepted during a rotation")
        for p in self.previous:
            _raw(p, "a previous secret")

    @classmethod
    def resolve(cls, current: str | bytes | None = None, previous: str | bytes | list[str] | None = None,
                ) -> SecretRing | None:
        """From values, else ``$EXECSTATE_KV_SECRET`` / ``$EXECSTATE_KV_SECRET_PREVIOUS`` (comma-
        separated); ``None`` when no current secret is set."""
        if current is None:
            current = os.environ.get(SECRET_ENV) or None
        if current is None:
            return None
        if previous is None:
            previous = [p for p in (os.environ.get(PREVIOUS_ENV) or "").split(",") if p]
        elif isinstance(previous, str | bytes):
            previous = [previous]
        return cls(_raw(current, "the secret"), tuple(_raw(p, "a previous secret") for p in previous))

    @classmethod
    def ephemeral(cls) -> SecretRing:
        """A ring with a random 32-byte key known to this process only (``shared`` False)."""
        return cls(secrets.token_bytes(32), (), shared=False)

    def sign(self, domain: bytes, payload: bytes) -> str:
        """Hex HMAC-SHA256 of ``domain + payload`` under the current secret."""
        return hmac.new(self.current, domain + payload, hashlib.sha256).hexdigest()

    def verify(self, domain: bytes, payload: bytes, signature: object) -> bool:
        """True when ``signature`` is ``sign(domain, payload)`` under any accepted secret."""
        if not isinstance(signature, str) or len(signature) != 64:
            return False
        ok = False
        for secret in (self.current, *self.previous):  # no early exit: the same work for every secret
            ok |= hmac.compare_digest(signature, hmac.new(secret, domain + payload, hashlib.sha256).hexdigest())
        return ok
