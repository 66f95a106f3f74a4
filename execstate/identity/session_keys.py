"""Session state keys: the identity of a session's state at a step boundary (docs/contracts.md 2, 6).

A session's state is its block chain (the tokens, rooted in the provenance), its step index,
its event epoch and its branch id. Its key is a domain-separated sha256 over:

- ``chain``: the :data:`BlockKey` of the last *full* block of the session's tokens, or the
  provenance root key when it has none (so the whole provenance and every full block are in it);
- ``tail``: the tokens after the last full block (fewer than a block), which no block key covers;
- ``step_index`` and ``event_epoch`` (non-negative ints) and ``branch_id`` (a non-empty UTF-8
  string, unique per branch: a fork gets a new one).

Byte layout (integers little-endian; ``u64(x)`` is 8 bytes)::

    sha256(u64(len(DOMAIN_SESSION)) DOMAIN_SESSION chain[32] u64(n) tail[0..n) as int64
           u64(step_index) u64(event_epoch) u64(len(b)) b)      with b = branch_id as UTF-8

Equal states give equal keys in every process (never Python ``hash()``); a weights update or any
provenance change changes the root, hence the key of every session state computed under it.
``tests/identity/test_session_keys.py`` pins a golden value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NewType

from execstate.identity.keys import BlockKey, _domain_hasher, _pack_tokens, _u64, check_key

SessionKey = NewType("SessionKey", bytes)
"""32-byte sha256 digest identifying one session state (chain, step, epoch, branch)."""

DOMAIN_SESSION = b"execstate/v1/session"
_SESSION_HASHER = _domain_hasher(DOMAIN_SESSION)


def session_state_key(
    chain: BlockKey, tail: Sequence[int], step_index: int, event_epoch: int, branch_id: str
) -> SessionKey:
    """The key of a session state (module docstring). Raises ``TypeError``/``ValueError`` on a bad
    field; pure function."""
    check_key(chain, "chain")
    for name, v in (("step_index", step_index), ("event_epoch", event_epoch)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
            raise ValueError(f"{name} must be a non-negative int below 2**64, got {v!r}")
    if not isinstance(branch_id, str) or not branch_id:
        raise ValueError(f"branch_id must be a non-empty string, got {branch_id!r}")
    packed = _pack_tokens(tail)
    branch = branch_id.encode("utf-8")
    h = _SESSION_HASHER.copy()
    h.update(chain)
    h.update(_u64(len(packed) // 8))
    h.update(packed)
    h.update(_u64(step_index))
    h.update(_u64(event_epoch))
    h.update(_u64(len(branch)))
    h.update(branch)
    return SessionKey(h.digest())
