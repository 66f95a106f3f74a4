"""What an LM session holds, counted per tenant: pinned KV blocks and checkpoint memory (docs/security.md).

Engine thread only (the LM sessions' owner thread), pure bookkeeping over the resident sessions:

- :func:`session_blocks`: the distinct KV blocks a session pins (its state, its live checkpoints
  and its origin); a tenant's ``pinned_blocks`` is the sum over its resident sessions (a fork
  shares its parent's blocks and counts them again: an upper bound of the KV it keeps alive);
- :func:`step_new_blocks`: a conservative bound on the blocks a step can add to its session
  (every token it may append, beyond the full blocks the session holds), checked against the
  tenant's ``pinned_blocks`` quota before the step starts;
- :func:`checkpoint_bytes`: the host memory of a session's checkpoints (tokens, keys, route rows,
  RNG state: ``LMSaved.nbytes``), released when they are;
- :func:`usage`: per tenant, what ``/metrics`` shows (tenant names, never keys), hibernated
  sessions and their bytes included.
"""

from __future__ import annotations

from typing import Any

from execstate.identity.tenant import TenantId
from execstate.session.lm.events import INPUT
from execstate.session.lm.state import LMSaved, LMState
from execstate.session.runtime.lifecycle import SessionRuntime
from execstate.session.runtime.manager import SessionManager


def lm_state(rt: SessionRuntime) -> LMState:
    state = rt.state
    assert isinstance(state, LMState)
    return state


def session_blocks(rt: SessionRuntime) -> set[int]:
    ids = lm_state(rt).block_ids()
    for cp in [*rt.checkpoints, rt.origin]:
        saved = cp.saved
        if not cp.released and isinstance(saved, LMSaved):
            ids |= saved.block_ids()
    return ids


def pinned_blocks(manager: SessionManager, tenant: TenantId) -> int:
    return sum(len(session_blocks(rt)) for rt in manager.resident() if rt.owner.tenant == tenant)


CHECKPOINT_OVERHEAD_BYTES = 1024
"""The small objects of one checkpoint (the checkpoint, its saved state, the pinned blocks'
record, the event queue's snapshot), measured: ~1.1 KB each over 5,000 checkpoints."""


def checkpoint_bytes(rt: SessionRuntime) -> int:
    """Host memory of ``rt``'s checkpoints: each one's small objects, plus every token, key and RNG
    copy they hold, counted once however many checkpoints share it (``LMSaved.parts``)."""
    seen: dict[int, int] = {}
    live = rt.checkpoints
    for cp in live:
        if isinstance(cp.saved, LMSaved):
            for obj, n in cp.saved.parts():
                seen[id(obj)] = n
        seen[id(cp.events)] = 96 * (len(cp.events.acks) + len(cp.events.pending))  # the event queue's snapshot
    return CHECKPOINT_OVERHEAD_BYTES * len(live) + sum(seen.values())


def step_new_blocks(rt: SessionRuntime, input: list[int] | str | None, max_tokens: int | None, block_size: int,
                    max_model_len: int) -> int:
    """At most how many blocks a step of ``rt`` with ``input`` can add (module docstring)."""
    state = lm_state(rt)
    n = len(state.token_ids) + (len(input) if input is not None else 0)  # a text input: at most a token per char
    for entry in rt.events.snapshot().pending:
        n += sum(len(e.data) for e in entry if e.kind == INPUT)
    budget = max_tokens if max_tokens is not None else state.params.max_tokens
    n = min(n + (budget if budget is not None else max_model_len), max_model_len)
    return max(0, -(-n // block_size) - state.num_kv_tokens // block_size)


def usage(manager: SessionManager) -> dict[TenantId, dict[str, Any]]:
    """Per tenant: the manager's counts plus ``pinned_blocks``, ``checkpoint_bytes`` and
    ``hibernated_bytes`` (the manifests and units of its hibernated sessions)."""
    out: dict[TenantId, dict[str, Any]] = {t: dict(c, pinned_blocks=0, checkpoint_bytes=0, hibernated_bytes=0)
                                           for t, c in manager.usage().items()}
    for rt in manager.resident():
        counts = out[rt.owner.tenant]
        counts["hibernated_bytes"] += getattr(rt.hibernation, "nbytes", 0)
        counts["pinned_blocks"] += len(session_blocks(rt))
        counts["checkpoint_bytes"] += checkpoint_bytes(rt)
    return out
