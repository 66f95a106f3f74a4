"""API keys and the tenants they stand for (docs/security.md).

``execstate serve --api-key KEY`` (repeatable) and ``--api-keys-file FILE`` (one ``KEY TENANT`` per
line; ``#`` comments and blank lines ignored) give the server its keys. A key given with
``--api-key`` alone is the tenant ``default``; keys of one tenant share everything that tenant owns.
With no key at all the server is open (local use): every caller is :data:`LOCAL_TENANT` and the
start-up log says so loudly.

Keys are never kept or logged in the clear: the :class:`KeyRing` holds their sha256 digests and
looks a presented key up by its digest. Comparing digests leaks nothing a caller can use: to make
a lookup's timing depend on a stored key's bytes it would need sha256 preimages.
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from execstate.identity.tenant import LOCAL_TENANT, TenantId, tenant_id

DEFAULT_TENANT = TenantId("default")
MIN_KEY_CHARS = 8
MAX_KEY_CHARS = 512


BEARER = "bearer "


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header (None without one)."""
    given = authorization or ""
    return given[len(BEARER):] if given[:len(BEARER)].lower() == BEARER else None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class KeyRing:
    """Digest of each accepted key -> its tenant. Empty: the server is open (:data:`LOCAL_TENANT`)."""

    _tenants: dict[bytes, TenantId] = field(default_factory=dict, repr=False)

    @property
    def open(self) -> bool:
        return not self._tenants

    @property
    def tenants(self) -> list[TenantId]:
        return sorted(set(self._tenants.values()))

    def tenant_of(self, key: str | None) -> TenantId | None:
        """The tenant of ``key``; :data:`LOCAL_TENANT` for an open server; None for a wrong key."""
        if self.open:
            return LOCAL_TENANT
        if not key:
            return None
        return self._tenants.get(_digest(key))

    @classmethod
    def build(cls, keys: list[str] | None = None, keys_file: str | Path | None = None) -> KeyRing:
        """From ``--api-key`` values (tenant ``default``) and an ``--api-keys-file``; ``ValueError``
        naming the line for a malformed entry, a short key, or one key given for two tenants."""
        pairs: list[tuple[str, TenantId, str]] = [(k, DEFAULT_TENANT, "--api-key") for k in keys or []]
        if keys_file is not None:
            for n, line in enumerate(Path(keys_file).read_text().splitlines(), 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                parts = line.split()
                if len(parts) != 2:
                    raise ValueError(f"{keys_file}:{n}: expected 'KEY TENANT', got {len(parts)} fields")
                try:
                    pairs.append((parts[0], tenant_id(parts[1]), f"{keys_file}:{n}"))
                except ValueError as exc:
                    raise ValueError(f"{keys_file}:{n}: {exc}") from None
        table: dict[bytes, TenantId] = {}
        for key, tenant, where in pairs:
            if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS or any(c.isspace() for c in key):
                raise ValueError(f"{where}: an API key is {MIN_KEY_CHARS}-{MAX_KEY_CHARS} characters without spaces")
            d = _digest(key)
            if table.get(d, tenant) != tenant:
                raise ValueError(f"{where}: this key is already given for tenant {table[d]!r}")
            table[d] = tenant
        return cls(table)


def keys_from_args(args: argparse.Namespace) -> KeyRing:
    """``--api-key`` (repeated) and ``--api-keys-file`` of ``execstate serve``; ``ValueError`` naming
    a bad entry."""
    keys = args.api_key
    if isinstance(keys, str):  # a namespace built by hand with one key
        keys = [keys]
    return KeyRing.build(keys or [], getattr(args, "api_keys_file", None))
