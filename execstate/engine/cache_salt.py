"""Per-request cache salt (vLLM's ``cache_salt``): tenants of one engine never share a block.

A prompt dict may carry ``"cache_salt"`` (offline: ``{"prompt_token_ids": [...],
"cache_salt": "tenant-a"}``; HTTP: the request body's ``cache_salt``). The salt replaces
the engine-wide ``EngineConfig.cache_salt`` in the provenance root of that request's
block keys (``KVCacheManager.root_key``), so requests with different salts, or a salted
and an unsalted one, never share a unit, and a request's ``cached_tokens`` /
``prompt_token_sources`` only ever count blocks computed under its own salt. A request
without one uses the engine-wide salt (``None``: the shared cache).

A salt is a non-empty string of at most ``MAX_CACHE_SALT_CHARS`` characters that is valid
UTF-8 text; anything else is a ``ValueError`` naming ``cache_salt``.
"""

from __future__ import annotations

from typing import Any

MAX_CACHE_SALT_CHARS = 256


def check_cache_salt(value: object) -> str | None:
    """``value`` if it is a valid salt or ``None``; else ``ValueError`` naming ``cache_salt``."""
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
    return value


def cache_salt_of(prompt: Any) -> str | None:
    """The validated salt a prompt carries (only a prompt dict can), ``None`` without one."""
    return check_cache_salt(prompt.get("cache_salt")) if isinstance(prompt, dict) else None
