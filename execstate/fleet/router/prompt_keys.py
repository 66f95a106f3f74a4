"""The execution-state keys a request would look up on a replica.

A replica keys a prompt's full blocks under its :class:`ExecutionIdentity`: its provenance, free
routes and the request's :class:`CacheScope` (the caller's tenant or shared group, and its salt;
``engine/kv_cache_manager.py``'s ``identity_of``). :func:`request_keys` derives the same chain with
the same value, so a replica on another weights version or device, or a block of another tenant or
salt, yields other keys and scores 0: nothing else needs to compare versions or owners. At most
``(len(tokens) - 1) // block_size`` blocks count, as in the engine (the last prompt token is always
computed). Pure function: callers memoize per (provenance, block size) if needed.
"""

from __future__ import annotations

from collections.abc import Sequence

from execstate.identity.execution import ExecutionIdentity
from execstate.identity.keys import BlockKey
from execstate.identity.provenance import Provenance
from execstate.identity.scope import LOCAL_SCOPE, CacheScope


def request_keys(provenance: Provenance, block_size: int, token_ids: Sequence[int],
                 scope: CacheScope = LOCAL_SCOPE, max_blocks: int | None = None) -> list[BlockKey]:
    """The keys of the prompt's blocks that could be cache hits (at most ``max_blocks``)."""
    n = max(0, (len(token_ids) - 1) // block_size)
    if max_blocks is not None:
        n = min(n, max_blocks)
    return ExecutionIdentity(provenance, scope).chain(token_ids, block_size, num_blocks=n)
