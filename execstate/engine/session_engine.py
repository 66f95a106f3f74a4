"""What the LM session kind reads of its engine, as protocols (``session/lm/``).

``LMSessions`` is built on the engine's thread from an engine and its session port
(``engine/session_port.py``: blocks, steps, hand-overs) and keeps both; the engine is typed
against :class:`SessionEngine`, not the engine class, so that the session kind depends on these
members only (``LLMEngine`` has them all; mypy checks it where an ``LMSessions`` is built:
``AsyncEngine.own_sessions``, ``execstate.LLM``):

- what steps and states are checked against and built with: ``config`` (the session options),
  ``model_config`` (vocabulary, route shape), ``max_model_len``, ``block_size``, ``tokenizer``,
  ``grammar``, ``generator`` (a session's seed when none is given), ``provenance`` (a session's
  state is stale when it changed), ``return_routes``, ``kv_holds`` (where a session's blocks are
  held; ``BlockHolds``, re-exported by ``engine/session_port.py``);
- the offload tiers as a hibernating or copied session uses them: :class:`SessionTiers`
  (``offload``; None without tiers);
- the PD connector as a migration uses it: :class:`SessionPeer` (``pd``; None without one);
- driving the engine from the caller's thread (the offline ``Session``, an in-process migration):
  ``step``, ``poll``, ``has_unfinished_requests``.

Contract: engine thread only, as the engine itself (the offline caller's thread is that thread).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from execstate.engine.config import EngineConfig
    from execstate.engine.grammar.compiler import GrammarCompiler
    from execstate.engine.outputs import RequestOutput
    from execstate.engine.tokenizer import Tokenizer
    from execstate.identity.keys import BlockKey
    from execstate.identity.provenance import Provenance
    from execstate.identity.secret_ring import SecretRing
    from execstate.model.config import ModelConfig
    from execstate.state.block_holds import BlockHolds
    from execstate.state.block_pool import BlockId
    from execstate.state.tiers.manifest_store import ManifestStore
    from execstate.transfer.handoff import Handoff

__all__ = ["SessionEngine", "SessionPeer", "SessionTiers"]


class SessionTiers(Protocol):
    """The offload tiers (``OffloadConnector``) as a session kind uses them: the rings its
    manifests are signed with (``ring``: the shared one, else this process's own key;
    ``shared_ring``: None without a shared secret), the shared manifest store (None without a
    shared tier), a unit's size, waiting for write-backs, adopting a shared tier's units."""

    @property
    def ring(self) -> SecretRing: ...

    @property
    def shared_ring(self) -> SecretRing | None: ...

    @property
    def manifests(self) -> ManifestStore | None: ...

    @property
    def unit_nbytes(self) -> int: ...

    def flush(self, timeout: float | None = 30.0) -> bool: ...

    def adopt_shared(self, keys: Sequence[BlockKey]) -> int: ...


class SessionPeer(Protocol):
    """The PD connector as a migration uses it: this instance's id, the shared secrets (None:
    unsigned, no migration), whether it exports (a producer) and loads (a consumer), exporting
    blocks, releasing an export, accepting a handoff (``HandoffError`` on a bad one)."""

    @property
    def instance_id(self) -> str: ...

    @property
    def secrets(self) -> SecretRing | None: ...

    @property
    def exports(self) -> bool: ...

    @property
    def is_consumer(self) -> bool: ...

    def export_blocks(self, block_ids: list[BlockId], keys: list[BlockKey], routes: np.ndarray | None) -> Handoff: ...

    def release_export(self, transfer_id: str) -> None: ...

    def accept_handoff(self, params: Mapping[str, Any]) -> Handoff: ...


class SessionEngine(Protocol):
    """The engine as the LM session kind reads it (module docstring)."""

    @property
    def config(self) -> EngineConfig: ...

    @property
    def model_config(self) -> ModelConfig: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def tokenizer(self) -> Tokenizer | None: ...

    @property
    def grammar(self) -> GrammarCompiler | None: ...

    @property
    def generator(self) -> torch.Generator: ...

    @property
    def provenance(self) -> Provenance: ...

    @property
    def return_routes(self) -> bool: ...

    @property
    def kv_holds(self) -> BlockHolds: ...

    @property
    def offload(self) -> SessionTiers | None: ...

    @property
    def pd(self) -> SessionPeer | None: ...

    def step(self) -> list[RequestOutput]: ...

    def poll(self) -> None: ...

    def has_unfinished_requests(self) -> bool: ...
