"""Cache scope: who may share cached state (the request-level half of an execution's identity).

A :class:`CacheScope` is built at the edge, from the caller's authenticated tenant and the
client's ``cache_salt``, *before* anything is admitted or evicted, and travels as one typed value
down to the keys. It enters the root of every block key (``identity/execution.py``), so:

- **Tenants are isolated by default.** Two tenants' requests never share a block, whatever they
  send: the tenant is in the key, and only the server (never the client) names it.
- **A salt narrows, never widens.** ``cache_salt`` partitions the cache *within* the tenant; the
  same salt sent by another tenant names another partition.
- **Sharing is the operator's choice.** A :class:`PrefixSharing` policy names groups of tenants
  that share one partition (e.g. a common system prompt served to every team). Inside a group
  every member can learn, by timing or ``cached_tokens``, which prompts another member sent:
  that is the risk the operator takes (docs/security.md).

One limit per field, checked here and nowhere else: a tenant or group name is 1-64 of
``[A-Za-z0-9._-]`` (``identity/tenant.py``), a salt is 1-:data:`MAX_CACHE_SALT_CHARS` characters
of valid UTF-8 text. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NewType

from execstate.identity.tenant import LOCAL_TENANT, TenantId, tenant_id

CacheSalt = NewType("CacheSalt", str)
"""A client's cache salt, validated (:func:`cache_salt`)."""

ShareGroup = NewType("ShareGroup", str)
"""An operator-named group of tenants that share one cache partition."""

MAX_CACHE_SALT_CHARS = 256


def cache_salt(value: object) -> CacheSalt | None:
    """``value`` as a :data:`CacheSalt` (``None`` stays ``None``); ``ValueError`` naming ``cache_salt``."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"cache_salt must be a non-empty string, got {value!r}"[:200])
    if len(value) > MAX_CACHE_SALT_CHARS:
        raise ValueError(f"cache_salt has {len(value)} characters; at most {MAX_CACHE_SALT_CHARS} allowed")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("cache_salt is not valid UTF-8 text") from None
    return CacheSalt(value)


def share_group(name: object) -> ShareGroup:
    """``name`` as a :data:`ShareGroup` (the tenant-name rules); ``ValueError`` naming it."""
    try:
        return ShareGroup(tenant_id(name))  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(f"a shared prefix group name is 1-64 letters, digits, '.', '_' or '-', got {name!r}") from None


@dataclass(frozen=True)
class CacheScope:
    """The partition of the cache a request reads and writes (module docstring).

    ``tenant``: who asked (always recorded; KV events are filtered by it); ``group``: the
    operator's shared group the tenant belongs to, which replaces the tenant in the key;
    ``salt``: the client's narrowing inside that partition.
    """

    tenant: TenantId = LOCAL_TENANT
    salt: CacheSalt | None = None
    group: ShareGroup | None = None

    def __post_init__(self) -> None:
        tenant_id(self.tenant)  # the scope is built by the server, but never trusted unchecked
        cache_salt(self.salt)
        if self.group is not None:
            share_group(self.group)

    @classmethod
    def build(cls, tenant: object = LOCAL_TENANT, salt: object = None, group: object = None) -> CacheScope:
        """A scope from untrusted values: each field checked, ``ValueError`` naming the field."""
        return cls(tenant_id(tenant), cache_salt(salt), None if group is None else share_group(group))  # type: ignore[arg-type]

    @property
    def partition(self) -> str:
        """What the key holds: ``group:<name>`` inside a shared group, else ``tenant:<name>``."""
        return f"group:{self.group}" if self.group is not None else f"tenant:{self.tenant}"

    def with_salt(self, salt: CacheSalt | None) -> CacheScope:
        return CacheScope(self.tenant, salt, self.group)


LOCAL_SCOPE = CacheScope()
"""The scope of local (offline, keyless) use: the local tenant, no salt."""


@dataclass(frozen=True)
class PrefixSharing:
    """The operator's sharing policy: tenant -> the group whose partition it uses.

    Empty (the default): every tenant has its own partition. A tenant is in at most one group.
    """

    groups: Mapping[TenantId, ShareGroup] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> PrefixSharing:
        """From ``--shared-prefix-group GROUP=TENANT[,TENANT...]`` values; ``ValueError`` naming the entry."""
        groups: dict[TenantId, ShareGroup] = {}
        for spec in specs:
            name, eq, members = spec.partition("=")
            if not eq or not members:
                raise ValueError(f"--shared-prefix-group {spec!r}: expected GROUP=TENANT[,TENANT...]")
            group = share_group(name)
            for member in members.split(","):
                tenant = tenant_id(member.strip())
                if groups.get(tenant, group) != group:
                    raise ValueError(f"--shared-prefix-group: tenant {tenant!r} is in two groups "
                                     f"({groups[tenant]!r} and {group!r})")
                groups[tenant] = group
        return cls(groups)

    def scope(self, tenant: TenantId, salt: object = None) -> CacheScope:
        """The scope of a request from ``tenant`` with the client's ``salt`` (checked here)."""
        return CacheScope(tenant, cache_salt(salt), self.groups.get(tenant))
