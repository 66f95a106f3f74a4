"""KV units that another instance (PD) or an offload tier holds: the protocol ``KVCacheManager``
loads a request's prefix through, and what a finished load reports. Used by the PD decode side
(``engine/pd_loads.py``), by session migration's target and by the offload tiers
(``engine/offload_loads.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from execstate.engine.request import Request
from execstate.identity.keys import BlockKey
from execstate.state.block_pool import BlockId


class ExternalLoadError(RuntimeError):
    """Loading state from another instance failed or cannot start: a request-level error."""


@dataclass(frozen=True)
class ExternalLoad:
    """The outcome of one load. ``error`` set: the request fails (policy ``fail``, or blocks that
    cannot be trusted whatever the policy); else the first ``num_verified_blocks`` blocks hold
    verified KV and ``routes`` (int16 ``[>= their tokens, L, K]``, the source's records) their rows.
    ``offloaded``: the blocks came from this engine's offload tiers (``prompt_token_sources``
    ``offloaded``), not from another instance (``transferred``)."""

    num_verified_blocks: int
    routes: np.ndarray | None
    error: str | None = None
    offloaded: bool = False


class FinishedLoad(NamedTuple):
    request: Request
    load: ExternalLoad


class ExternalPrefix(Protocol):
    """A source of KV units for a request's prefix held by another instance (PD), loaded
    asynchronously. Engine thread only. Call order per request: ``num_blocks``; then either
    ``skip_load`` (the local cache covered every offered block) or ``start_load`` followed, some
    steps later, by exactly one :class:`FinishedLoad` from ``finished_loads`` (``cancel_load`` in
    between makes it come sooner when the load had not started). The request's blocks stay
    allocated until that result arrived: until then the transfer may still write them."""

    def num_blocks(self, req: Request) -> int:
        """Leading full blocks of the request the source can provide (0: nothing to load)."""
        ...

    def start_load(self, req: Request, first_block: int, keys: list[BlockKey], dst: list[BlockId]) -> None:
        """Begin filling ``dst`` with blocks ``first_block...`` whose expected keys are ``keys``.
        Raises ExternalLoadError when the load cannot start (limits): nothing started."""
        ...

    def skip_load(self, req: Request) -> None:
        """Nothing to load after all: let the source release what it holds for ``req`` now."""
        ...

    def cancel_load(self, req: Request) -> None:
        """``req`` was aborted while loading; its result still arrives (maybe sooner)."""
        ...

    def finished_loads(self) -> list[FinishedLoad]:
        """Loads that finished since the last call, in completion order."""
        ...
