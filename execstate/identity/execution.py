"""The execution identity: one value from which every key of cached state is derived.

An :class:`ExecutionIdentity` names the root of an execution: the engine's :class:`Provenance`
(model, exact weights version, dtype, numerics naming the device and kernel family), the
:class:`RouteMode` and the request's :class:`CacheScope` (tenant or shared group, client salt).
It is built once per request, from values that were each validated where they were made, and
every block key, tier unit, KV event, router score, migration and hibernation record is derived
from it by :meth:`ExecutionIdentity.chain`. There is no second derivation anywhere.

Encoding (version :data:`IDENTITY_VERSION`): UTF-8 JSON, sorted keys, no whitespace::

    {"dtype", "model_id", "numerics", "route_mode", "salt", "scope", "v", "weights_version"}

with ``scope`` the partition (``tenant:<name>`` or ``group:<name>``) and ``salt`` the client's
salt or ``null``. The root is ``keys.root_from_encoding`` of it; block keys chain from the root
with ``keys.block_key``, a block whose routes are forced carrying ``keys.routes_extra`` of its
rows. ``tests/identity/test_execution_identity.py`` pins the bytes against an independent
implementation.

Every field changes every key: a weights update, another device, replayed routes, another
tenant or another salt can never hit state computed under a different value. Pure Python.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

import numpy as np

from execstate.identity.keys import (
    BlockKey,
    _hash_block,
    _pack_tokens,
    root_from_encoding,
    routes_extra,
)
from execstate.identity.provenance import Provenance
from execstate.identity.scope import LOCAL_SCOPE, CacheScope

IDENTITY_VERSION = 2


class RouteMode(StrEnum):
    """How a MoE router chose the experts of the state: top-k (``free``) or given (``replayed``)."""

    FREE = "free"
    REPLAYED = "replayed"


@dataclass(frozen=True)
class ExecutionIdentity:
    """The root of an execution (module docstring). Immutable, hashable, any thread."""

    provenance: Provenance
    scope: CacheScope = LOCAL_SCOPE
    route_mode: RouteMode = RouteMode.FREE

    def __post_init__(self) -> None:
        if not isinstance(self.provenance, Provenance):
            raise TypeError(f"provenance must be a Provenance, got {type(self.provenance).__name__}")
        if not isinstance(self.scope, CacheScope):
            raise TypeError(f"scope must be a CacheScope, got {type(self.scope).__name__}")
        if not isinstance(self.route_mode, RouteMode):
            raise TypeError(f"route_mode must be a RouteMode, got {self.route_mode!r}")

    def encode(self) -> bytes:
        """Canonical bytes of this identity (module docstring)."""
        p = self.provenance
        doc = {"dtype": p.dtype, "model_id": p.model_id, "numerics": p.numerics, "route_mode": self.route_mode.value,
               "salt": self.scope.salt, "scope": self.scope.partition, "v": IDENTITY_VERSION,
               "weights_version": p.weights_version}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @cached_property
    def root(self) -> BlockKey:
        """The parent key of the first block of every sequence computed under this identity."""
        return root_from_encoding(self.encode())

    def with_provenance(self, provenance: Provenance) -> ExecutionIdentity:
        return ExecutionIdentity(provenance, self.scope, self.route_mode)

    def extend(self, keys: list[BlockKey], token_ids: Sequence[int] | np.ndarray, block_size: int, *,
               num_blocks: int | None = None, forced_routes: np.ndarray | None = None) -> None:
        """Append to ``keys`` (the keys of a prefix of ``token_ids``' blocks, possibly none) the
        keys of the following full blocks, up to ``num_blocks`` in all (default: every full block).

        ``forced_routes`` (``[rows, layers, top_k]``, only with :attr:`RouteMode.REPLAYED`): block
        ``i``'s extra is :func:`routes_extra` of its rows while rows remain. Only the new blocks'
        tokens are read: the cost is O(new blocks).
        """
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if forced_routes is not None and self.route_mode is not RouteMode.REPLAYED:
            raise ValueError("forced routes key blocks only under RouteMode.REPLAYED")
        full = len(token_ids) // block_size
        end = full if num_blocks is None else min(full, num_blocks)
        start = len(keys)
        if start >= end:
            return
        view = memoryview(_pack_tokens(token_ids[start * block_size:end * block_size]))
        step = block_size * 8
        parent = keys[-1] if keys else self.root
        for i in range(start, end):
            extra = None
            if forced_routes is not None and i * block_size < len(forced_routes):
                extra = routes_extra(forced_routes[i * block_size:(i + 1) * block_size])
            j = i - start
            parent = _hash_block(parent, block_size, view[j * step:(j + 1) * step], extra)
            keys.append(parent)

    def chain(self, token_ids: Sequence[int] | np.ndarray, block_size: int, *, num_blocks: int | None = None,
              forced_routes: np.ndarray | None = None) -> list[BlockKey]:
        """The keys of ``token_ids``' full blocks (at most ``num_blocks``); a tail gets no key."""
        keys: list[BlockKey] = []
        self.extend(keys, token_ids, block_size, num_blocks=num_blocks, forced_routes=forced_routes)
        return keys
