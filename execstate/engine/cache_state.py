"""A request's place in the prefix cache (owned by ``engine/kv_cache_manager.py``).

``scope``: who may share its cached state, its tenant (or shared group) and the client's salt
(``identity/scope.py``), part of the execution identity its block keys derive from;
``block_keys``: the keys of its full blocks, in order (a chain), valid for the engine's
provenance, extended in O(new blocks); ``leased_keys``: the block keys whose route records it
leases (R3; released when it finishes); ``num_committed_blocks``: how many of its full blocks
are registered in the prefix cache (or were hit from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from execstate.identity.keys import BlockKey
from execstate.identity.scope import LOCAL_SCOPE, CacheScope


@dataclass(eq=False)
class CacheState:
    scope: CacheScope = LOCAL_SCOPE
    block_keys: list[BlockKey] = field(default_factory=list)
    leased_keys: list[BlockKey] = field(default_factory=list)
    num_committed_blocks: int = 0
