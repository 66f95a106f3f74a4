"""Handoff parameters and who may send them (docs/contracts.md 5 and 8: "checked before it is trusted,
and so is who sent it"). Pure Python.

A prefill instance (P) answers an exported request with handoff parameters; the proxy passes them
to a decode instance (D), which dials P's control channel and reads the KV. D must never dial an
address a client invented, so it accepts a handoff only when

1. **P signed it**: ``signature`` is ``HMAC-SHA256(secret, canonical(fields))`` in hex, where
   ``secret`` is shared by P, D and the proxy and ``canonical`` is the domain tag
   ``execstate/v1/handoff`` + NUL + the JSON of ``remote_engine_id, remote_addr, transfer_id,
   epoch, num_blocks, block_size, expires_at`` (sorted keys, no spaces, ASCII). ``expires_at`` is
   a Unix time in whole seconds (P sets it to the export's TTL); an expired handoff is refused
   (the hosts' clocks must agree to within a few seconds, as NTP gives). Compared with
   ``hmac.compare_digest``. A present but wrong signature is refused even for an allow-listed
   engine; or
2. **it names an allow-listed prefill engine** (``remote_engine_id`` in D's
   ``allowed_prefill_engines``, engine id -> control address): D then dials the address from
   its own list, never the one in the JSON.

Anything else raises :class:`HandoffError` (a ``ValueError``: a 400 over HTTP, decided before the
request reaches the engine). Signing and checking go through the project's one
``SecretRing`` (``identity/secret_ring.py``: a config value or ``EXECSTATE_KV_SECRET``, at least
16 bytes): during a rotation a handoff signed with the previous secret
(``EXECSTATE_KV_SECRET_PREVIOUS``) is still accepted; P signs with the current one.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from execstate.identity.secret_ring import SECRET_ENV, SecretRing

DOMAIN = b"execstate/v1/handoff\x00"
_ADDR = re.compile(r"^tcp://[A-Za-z0-9.\-]+:[0-9]{1,5}$|^tcp://\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}$")
_MAX_ID = 256


class HandoffError(ValueError):
    """Handoff parameters that may not be used (unsigned, tampered, expired, unknown engine, malformed)."""


@dataclass(frozen=True)
class Handoff:
    """A verified (or locally produced) handoff: everything D needs to load P's export.

    ``remote_addr`` is the control address D will dial: the signed one, or the allow-list's.
    """

    remote_engine_id: str
    remote_addr: str
    transfer_id: str
    epoch: int
    num_blocks: int
    block_size: int
    expires_at: int

    def canonical(self) -> bytes:
        """The bytes the signature covers (see the module docstring)."""
        body = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return DOMAIN + body.encode("ascii")

    def sign(self, ring: SecretRing) -> str:
        return ring.sign(b"", self.canonical())  # canonical() starts with the domain tag

    def to_params(self, ring: SecretRing | None) -> dict[str, Any]:
        """The JSON ``kv_transfer_params`` P returns (signed when it has a ring)."""
        params: dict[str, Any] = {"do_remote_prefill": True, "do_remote_decode": False, **asdict(self)}
        if ring is not None:
            params["signature"] = self.sign(ring)
        return params


def check_allow_list(allowed: Mapping[str, str] | None) -> dict[str, str]:
    """Validate ``allowed_prefill_engines`` (engine id -> ``tcp://host:port``); ``ValueError`` names the entry."""
    if allowed is None:
        return {}
    if not isinstance(allowed, Mapping):
        raise ValueError(f"allowed_prefill_engines must be an object of engine id -> address, got {allowed!r}")
    for engine_id, addr in allowed.items():
        if not isinstance(engine_id, str) or not engine_id or not isinstance(addr, str) or not _ADDR.match(addr):
            raise ValueError(f"allowed_prefill_engines entry {engine_id!r}: {addr!r} is not 'tcp://host:port'")
    return dict(allowed)


def _str(params: Mapping[str, Any], key: str) -> str:
    v = params.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= _MAX_ID:
        raise HandoffError(f"kv_transfer_params.{key} must be a non-empty string of <= {_MAX_ID} chars")
    return v


def _int(params: Mapping[str, Any], key: str, low: int = 0) -> int:
    v = params.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < low or v >= 2**63:
        raise HandoffError(f"kv_transfer_params.{key} must be an integer >= {low}, got {v!r}")
    return v


def parse_handoff(params: Mapping[str, Any]) -> Handoff:
    """The handoff fields of ``params``, type-checked (not yet trusted)."""
    addr = _str(params, "remote_addr")
    if not _ADDR.match(addr):
        raise HandoffError(f"kv_transfer_params.remote_addr {addr!r} is not 'tcp://host:port'")
    return Handoff(
        remote_engine_id=_str(params, "remote_engine_id"),
        remote_addr=addr,
        transfer_id=_str(params, "transfer_id"),
        epoch=_int(params, "epoch"),
        num_blocks=_int(params, "num_blocks", 1),
        block_size=_int(params, "block_size", 1),
        expires_at=_int(params, "expires_at"),
    )


@dataclass(frozen=True)
class HandoffTrust:
    """D's (and the proxy's) decision on incoming handoff parameters; immutable, any thread.

    ``block_size``: when set, a handoff for another block size is refused (D's own).
    """

    secret: SecretRing | None = field(default=None, repr=False)
    allowed: Mapping[str, str] = field(default_factory=dict)
    block_size: int | None = None
    clock: Callable[[], float] = time.time

    def _verifies(self, h: Handoff, signature: object) -> bool:
        assert self.secret is not None
        return self.secret.verify(b"", h.canonical(), signature)  # canonical() starts with the domain tag

    def accept(self, params: Mapping[str, Any]) -> Handoff:
        """The trusted :class:`Handoff` of ``params`` (``do_remote_prefill`` true), or :class:`HandoffError`."""
        if not isinstance(params, Mapping):
            raise HandoffError("kv_transfer_params must be a JSON object")
        h = parse_handoff(params)
        signature = params.get("signature")
        listed = self.allowed.get(h.remote_engine_id)
        if signature is not None:
            if self.secret is None:
                raise HandoffError("signed kv_transfer_params but this instance has no handoff secret "
                                   f"(set {SECRET_ENV} or kv_secret)")
            if not self._verifies(h, signature):
                raise HandoffError("kv_transfer_params signature does not match (tampered, or another secret)")
        elif listed is None:
            raise HandoffError(
                f"kv_transfer_params from engine {h.remote_engine_id!r} are not signed and that engine is "
                "not in allowed_prefill_engines"
            )
        if h.expires_at <= self.clock():
            raise HandoffError(f"kv_transfer_params expired at {h.expires_at} (Unix time)")
        if self.block_size is not None and h.block_size != self.block_size:
            raise HandoffError(f"kv_transfer_params.block_size {h.block_size} is not this instance's {self.block_size}")
        if listed is not None and listed != h.remote_addr:
            h = replace(h, remote_addr=listed)  # dial our own list's address
        return h


def wants_remote_prefill(params: Mapping[str, Any] | None) -> bool:
    """True when ``params`` asks the receiving instance to load KV from another one."""
    return isinstance(params, Mapping) and bool(params.get("do_remote_prefill"))
