"""The state of an LM session: the LM kind's ``KindState`` (``session/runtime/lifecycle.py``).

- ``token_ids``: the context so far, every input and generated token in order.
- ``blocks``: :class:`HeldBlocks` (registered in the engine's block holds) with the KV of the
  first ``blocks.num_tokens`` tokens (after a completed step: every token but the last generated
  one), or None (nothing held: the next step recomputes, with prefix-cache hits).
- ``routes``: the :class:`RouteTrace` of the context when the engine returns routes; row ``i``
  is the routing of the forward pass over token ``i``.
- ``priority``: the scheduling class of its steps (``engine/scheduler.py``).
- ``params``, ``seed``, ``generator``: sampling. The generator is the session's own (seeded from
  ``seed``); its state is part of the session state, saved by every checkpoint and restored by a
  rollback, so re-running the same inputs reproduces the same tokens when sampling too.
- ``identity``: the :class:`ExecutionIdentity` (the engine's provenance, the session's tenant
  scope and salt) the KV and keys were computed under; its chain gives the keys. When the engine's
  identity for that scope differs (a weights update, any provenance change) the state is stale.
- ``grammar``: the matcher state of the session's structured-output constraint
  (``params.structured_outputs``; ``engine/grammar/matcher.py``), or None. It spans steps: each
  step's request advances it in place (like the generator), so a constrained output can be
  generated over several steps. It is execution state: a checkpoint keeps a copy, a rollback
  restores one, a fork clones one, and ``grammar_snapshot()`` is its serialisable form (the
  constraint's wire text + the tokens the matcher accepted), which a migration carries in its
  offer (``session/lm/migration_wire.py``: ``SessionOffer.grammar``) and a hibernated session
  stores the same way; the receiving side replays it (``GrammarCompiler.restore``).

Truncation (``LMSessions.truncate``: a rollback to a checkpoint that keeps the context's next
tokens): ``take_prefix(saved, n)`` pins the first KV blocks of the context's first ``n`` tokens
(all but the last of them: a step always computes at least one token) and copies those tokens and
their route rows, before the rollback drops the state's own references; ``put_prefix`` puts them
on the rolled-back state. The result is ``saved``'s state (sampling, generator, grammar) whose
context continues with the held tokens, their KV kept: what a rollback followed by a step sending
those tokens would compute, without computing them. A kept partial tail block that the prefix
cache holds as a full block is copied before the next step writes into it (the KV cache manager's
copy-on-write).

``save`` pins the blocks (one more reference each, no KV copied; the engine copies the shared
partial tail block before writing into it), copies the token list and the RNG state and keeps a
*view* of the route rows: a trace only appends past its known rows, and a restore or a fork
builds its own trace from a copy, so the view never changes.

Memory: ``LMSaved.nbytes`` is a checkpoint's host memory (token ids, block keys, route rows, RNG
state), counted per tenant in ``/metrics`` (``session/lm/tenancy.py``; an upper bound: checkpoints
of an unchanged state share one immutable copy of its tokens, keys and RNG state, so a run of
checkpoints without a step in between costs a few small objects each). ``release`` (of a saved
state, and of the state when its session ends) drops every reference it holds, so an ended
session remembered for its status keeps no context, keys, routes or KV.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from execstate.engine.grammar.matcher import GrammarMatcher, GrammarSnapshot
from execstate.engine.priority import PRIORITY_INTERACTIVE
from execstate.engine.route_trace import RouteTrace
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.session_port import BlockHolds, HeldBlocks
from execstate.identity.execution import ExecutionIdentity
from execstate.identity.keys import BlockKey

_NO_RNG = torch.empty(0, dtype=torch.uint8)


@dataclass(eq=False, slots=True)
class LMPrefix:
    """What ``LMState.take_prefix`` kept of a context for ``put_prefix`` (module docstring)."""

    token_ids: list[int]
    blocks: HeldBlocks | None  # pinned; None: no KV past what the checkpoint holds is kept
    routes: np.ndarray | None  # route rows of the kept KV past the checkpoint's rows


@dataclass(eq=False, slots=True)
class LMSaved:
    """An LM session's saved state (inside a checkpoint); ``release`` unpins its blocks once."""

    holds: BlockHolds
    token_ids: tuple[int, ...]
    keys: tuple[BlockKey, ...]
    blocks: HeldBlocks | None
    routes: np.ndarray | None
    params: SamplingParams
    seed: int
    rng_state: torch.Tensor
    identity: ExecutionIdentity
    grammar: GrammarMatcher | None = None  # a copy: never advanced
    released: bool = field(default=False, init=False)

    @property
    def root(self) -> BlockKey:
        return self.identity.root

    def parts(self) -> list[tuple[object, int]]:
        """The copies this saved state holds and their host bytes (tokens, keys, RNG state; the
        route rows are a view of the session's trace, not a copy): shared with other checkpoints
        of an unchanged state, so a caller counts each object once."""
        if self.released:
            return []
        return [(self.token_ids, 8 * len(self.token_ids) + 40), (self.keys, 72 * len(self.keys) + 40),
                (self.rng_state, self.rng_state.numel())]

    @property
    def nbytes(self) -> int:
        """Host memory of :meth:`parts` (counting shared copies as this state's own)."""
        return sum(n for _, n in self.parts())

    def block_ids(self) -> set[int]:
        return set(self.blocks.block_ids) if self.blocks is not None and not self.released else set()

    def drop_kv(self) -> None:
        """Unpin the blocks and keep the rest (a hibernating session's checkpoint): restoring it
        recomputes the KV, or reloads it from a tier."""
        if self.blocks is not None and not self.released:
            self.holds.release(self.blocks)
            self.blocks = None

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.blocks is not None:
            self.holds.release(self.blocks)
            self.blocks = None
        self.token_ids, self.keys, self.routes, self.rng_state = (), (), None, _NO_RNG


class LMState:
    def __init__(self, holds: BlockHolds, block_size: int, route_shape: tuple[int, int] | None,
                 params: SamplingParams, seed: int, identity: ExecutionIdentity,
                 priority: int = PRIORITY_INTERACTIVE) -> None:
        self.holds = holds
        self.block_size = block_size
        self.route_shape = route_shape  # (n_moe_layers, top_k) when the engine returns routes
        self.params = params
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.identity = identity
        self.priority = priority  # the scheduling class of its steps
        self.token_ids = []
        self.blocks: HeldBlocks | None = None
        self.routes: RouteTrace | None = RouteTrace(*route_shape) if route_shape is not None else None
        self.released = False
        self.grammar: GrammarMatcher | None = None
        self._keys: list[BlockKey] = []  # chain keys of token_ids' full blocks computed so far (append-only)
        self._saved_keys: tuple[BlockKey, ...] = ()  # the last save's copies, shared while unchanged
        self._saved_rng: torch.Tensor | None = None
        self._saved_rows: np.ndarray | None = None  # the last save's view of the route rows (views never change)
        self._saved_rows_of: tuple[int, int] = (0, 0)

    @property
    def token_ids(self) -> list[int]:
        """The context (replaced as a whole, never changed in place: the last save's copy is shared)."""
        return self._token_ids

    @token_ids.setter
    def token_ids(self, ids: list[int]) -> None:
        self._token_ids = ids
        self._saved_tokens: tuple[int, ...] | None = None

    # -- KindState ------------------------------------------------------------------------------
    def save(self) -> LMSaved:
        blocks = self.holds.pin(self.blocks) if self.blocks is not None else None
        rows = None
        if self.routes is not None:
            rows = self._saved_rows
            if rows is None or self._saved_rows_of != (id(self.routes), self.routes.rows_known):
                rows = self._saved_rows = self.routes.rows(0, self.routes.rows_known)
                self._saved_rows_of = (id(self.routes), self.routes.rows_known)
        if self._saved_tokens is None:
            self._saved_tokens = tuple(self._token_ids)
        if len(self._saved_keys) != len(self._keys):
            self._saved_keys = tuple(self._keys)
        rng = self.generator.get_state()
        if self._saved_rng is not None and torch.equal(rng, self._saved_rng):
            rng = self._saved_rng  # unchanged since the last save: one copy for both
        self._saved_rng = rng
        return LMSaved(self.holds, self._saved_tokens, self._saved_keys, blocks, rows, self.params, self.seed, rng,
                       self.identity, self.grammar.copy() if self.grammar is not None else None)

    def restore(self, saved: LMSaved) -> None:
        self._check_saved(saved)
        self.drop_kv()
        self._load(saved)

    def clone(self, saved: LMSaved | None) -> LMState:
        src = saved if saved is not None else self.save()
        try:
            self._check_saved(src)
            new = LMState(self.holds, self.block_size, self.route_shape, src.params, src.seed, src.identity,
                          self.priority)
            new._load(src)
            return new
        finally:
            if saved is None:
                src.release()  # the clone pinned its own references

    def release(self) -> None:
        """Give the KV back and drop the context (the session ended: only its status is kept)."""
        self.released = True
        self.drop_kv()
        self.token_ids, self._keys, self._saved_keys, self._saved_rng, self._saved_rows = [], [], (), None, None
        if self.route_shape is not None:
            self.routes = RouteTrace(*self.route_shape, capacity=1)

    def block_ids(self) -> set[int]:
        return set(self.blocks.block_ids) if self.blocks is not None else set()

    @property
    def root(self) -> BlockKey:
        return self.identity.root

    def chain(self) -> tuple[BlockKey, list[int]]:
        bs = self.block_size
        n_full = len(self.token_ids) // bs
        self.identity.extend(self._keys, self.token_ids, bs, num_blocks=n_full)
        return (self._keys[n_full - 1] if n_full else self.root), self.token_ids[n_full * bs :]

    # -- the LM kind's own operations -------------------------------------------------------------
    def grammar_snapshot(self) -> GrammarSnapshot | None:
        """The matcher state in its serialisable form (None: the output is not constrained)."""
        return self.grammar.snapshot() if self.grammar is not None else None

    @property
    def num_kv_tokens(self) -> int:
        return self.blocks.num_tokens if self.blocks is not None else 0

    def drop_kv(self) -> None:
        """Release the held blocks (the next step recomputes)."""
        if self.blocks is not None:
            self.holds.release(self.blocks)
            self.blocks = None

    def reroot(self, identity: ExecutionIdentity) -> None:
        """Re-prefill under a new identity: drop the KV, the keys and the route rows (all computed
        under the old provenance); the next step recomputes the whole context."""
        self.drop_kv()
        self.identity = identity
        self._keys, self._saved_keys, self._saved_rows = [], (), None
        if self.route_shape is not None:
            self.routes = RouteTrace(*self.route_shape)

    def take_prefix(self, saved: LMSaved, num_tokens: int) -> LMPrefix:
        """The context's first ``num_tokens``, with their KV (module docstring); ValueError
        (nothing pinned) unless ``saved`` is a live state of this context's branch (its tokens a
        prefix of the context, the same identity) and ``num_tokens`` is within
        ``[len(saved.token_ids), len(token_ids)]``."""
        self._check_saved(saved)
        n0, ids = len(saved.token_ids), self.token_ids
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not n0 <= num_tokens <= len(ids):
            raise ValueError(f"num_tokens must be an integer in [{n0}, {len(ids)}] (the checkpoint's context and "
                             f"this one's), got {num_tokens!r}")
        if saved.identity != self.identity or tuple(ids[:n0]) != saved.token_ids:
            raise ValueError("the checkpoint is not on this context's branch (its tokens are not a prefix of the "
                             "context, or it was computed under another identity)")
        kv = min(num_tokens - 1, self.num_kv_tokens)
        saved_kv = saved.blocks.num_tokens if saved.blocks is not None else 0
        if self.blocks is None or kv <= saved_kv:
            return LMPrefix(ids[:num_tokens], None, None)
        bs = self.block_size
        nb = -(-kv // bs)
        part = HeldBlocks(self.blocks.block_ids[:nb], kv, self.blocks.block_keys[: kv // bs],
                          min(self.blocks.num_committed_blocks, nb))
        rows = None
        if self.routes is not None and saved.routes is not None:
            rows = self.routes.rows(len(saved.routes), min(self.routes.rows_known, kv)).copy()
        return LMPrefix(ids[:num_tokens], self.holds.pin(part), rows)

    def put_prefix(self, prefix: LMPrefix) -> None:
        """After the rollback to the checkpoint ``take_prefix`` was given: the kept tokens and KV."""
        if prefix.blocks is not None:
            self.drop_kv()
            self.blocks = prefix.blocks
        self.token_ids = list(prefix.token_ids)
        if self.routes is not None and prefix.routes is not None and len(prefix.routes):
            self.routes.fill(self.routes.rows_known, prefix.routes)

    def drop_prefix(self, prefix: LMPrefix) -> None:
        """A prefix not put (the rollback was refused): unpin its blocks."""
        if prefix.blocks is not None:
            self.holds.release(prefix.blocks)
            prefix.blocks = None

    def _load(self, saved: LMSaved) -> None:
        self.blocks = self.holds.pin(saved.blocks) if saved.blocks is not None else None
        self.token_ids = list(saved.token_ids)
        self._keys, self._saved_keys, self._saved_rows = list(saved.keys), (), None
        if self.route_shape is not None:
            assert saved.routes is not None
            trace = RouteTrace(*self.route_shape, capacity=max(len(saved.routes), 64))
            if len(saved.routes):
                trace.fill(0, saved.routes)
            self.routes = trace
        self.params, self.seed, self.identity = saved.params, saved.seed, saved.identity
        self.generator.set_state(saved.rng_state)
        self.grammar = saved.grammar.copy() if saved.grammar is not None else None

    def _check_saved(self, saved: LMSaved) -> None:
        if saved.released:
            raise ValueError("this checkpoint's state was released")
