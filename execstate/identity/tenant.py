"""Tenants: who owns long-lived state (docs/security.md). Pure Python.

A server maps each API key to a tenant (``serve/principals.py``); every session, checkpoint, fork,
agent and world session records the tenant that created it, and every operation on it checks
that tenant. A tenant name is what ``/metrics`` labels per-tenant counts with, so it must never be
the key itself: names are short identifiers (letters, digits, ``._-``), checked by
:func:`tenant_id`. Without any key (local use) everything belongs to :data:`LOCAL_TENANT`.
"""

from __future__ import annotations

import re
from typing import NewType

TenantId = NewType("TenantId", str)
"""A tenant's name, e.g. ``"team-a"``."""

LOCAL_TENANT = TenantId("local")
"""The one tenant of a server started without API keys."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def tenant_id(name: object) -> TenantId:
    """``name`` as a :data:`TenantId`; ``ValueError`` naming the problem when it is not one."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"a tenant name is 1-64 letters, digits, '.', '_' or '-' (starting with a letter or "
                         f"digit), got {name!r}")
    return TenantId(name)
