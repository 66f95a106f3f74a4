"""The execution-state keys a request would look up on a replica (``identity/keys.py``).

A replica keys a prompt's full blocks under the root of its provenance with the request's route
mode and cache salt (``engine/kv_cache_manager.py``'s ``root_key``): the request's own salt, else
the replica's. :func:`request_keys` computes the same chain, so a replica on another weights
version, numerics or salt yields other keys and scores 0: nothing else needs to compare versions.
At most ``(len(tokens) - 1) // block_size`` blocks count, as in the engine (the last prompt token
is always computed). Keys are memoized per (provenance, salt, tokens) by the caller if needed:
this is a pure function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from execstate.identity.keys import BlockKey, block_key, root_key
from execstate.identity.provenance import Provenance


def request_root(provenance: Provenance, cache_salt: str | None) -> BlockKey:
    """The parent key of the request's first block on a replica of ``provenance`` (free routes)."""
    salt = provenance.cache_salt if cache_salt is None else cache_salt
    return root_key(replace(provenance, route_mode="free", cache_salt=salt))


def request_keys(provenance: Provenance, block_size: int, token_ids: Sequence[int],
                 cache_salt: str | None = None, max_blocks: int | None = None) -> list[BlockKey]:
    """The keys of the prompt's blocks that could be cache hits (at most ``max_blocks``)."""
    n = max(0, (len(token_ids) - 1) // block_size)
    if max_blocks is not None:
        n = min(n, max_blocks)
    keys: list[BlockKey] = []
    parent = request_root(provenance, cache_salt)
    for i in range(n):
        parent = block_key(parent, token_ids[i * block_size:(i + 1) * block_size])
        keys.append(parent)
    return keys
