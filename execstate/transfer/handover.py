"""Single-use, two-phase hand-over of long-lived state on the receiving server (docs/security.md). Pure Python.

Every offer that moves state to this server (a migrating session, a woken hibernated copy) names a
*nonce*, an expiry and this server's engine id, all inside its signature. The receiving server
keeps one entry per nonce in a :class:`HandoverLedger` until the entry's expiry (plus a margin for
clock skew), so an offer can be used once, and never after its expiry::

    admit --> IMPORTING --imported--> PENDING --commit--> COMMITTED
                 |                       |
                 +--------abort----------+--> ABORTED

- ``admit(nonce, expires_at)``: a nonce seen before is a **replay** (refused whatever its state);
  an expired offer is refused (``expired``); past ``max_entries`` live entries new offers are
  refused (``capacity``), an unexpired entry is never forgotten to make room.
- ``imported(nonce)``: the state is in place but **not served**: the receiver answers the sender
  (the acknowledgement).
- ``commit(nonce)``: the sender has closed its copy; the receiver starts serving. Refused once
  aborted (``aborted``) or after the entry's expiry (``expired``: the receiver then aborted it).
- ``abort(nonce)``: the sender never got the acknowledgement and asks the receiver to drop what it
  imported; refused once committed (``committed``: the receiver serves it, so the sender must not).
  An abort of an unknown nonce records it as ABORTED, so a late offer with that nonce is refused
  (unless the offer's expiry plus ``remember_s`` has passed: then nothing is recorded, since a
  committed entry forgotten by then must not read as aborted, and admit refuses the offer anyway).
- ``expire()`` (called on every operation): IMPORTING/PENDING entries past their expiry become
  ABORTED (their imported state is to be dropped: returned to the caller); entries past expiry
  plus ``remember_s`` are forgotten.

Together with the sender's rule (close its copy only after the acknowledgement; resume only after
the receiver confirmed an abort, or after the offer's expiry plus the same margin), at most one
server serves a piece of state at any time.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from execstate.errors import CodedError

DEFAULT_MAX_ENTRIES = 4096
DEFAULT_SKEW_S = 30.0  # expired offers are refused, and remembered this long after their expiry


class HandoverState(enum.Enum):
    IMPORTING = "importing"
    PENDING = "pending"
    COMMITTED = "committed"
    ABORTED = "aborted"


class HandoverError(CodedError):
    """A refused step; ``code``: ``replay``, ``expired``, ``capacity``, ``aborted``, ``committed``,
    ``importing``, ``pending``, ``unknown`` or ``invalid``."""


@dataclass
class _Entry:
    state: HandoverState
    expires_at: float


class HandoverLedger:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, remember_s: float = DEFAULT_SKEW_S,
                 clock: Callable[[], float] = time.time) -> None:
        if max_entries < 1 or not remember_s >= 0:
            raise ValueError("max_entries must be >= 1 and remember_s >= 0")
        self.max_entries = max_entries
        self.remember_s = remember_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}

    def state(self, nonce: str) -> HandoverState | None:
        e = self._entries.get(nonce)
        return None if e is None else e.state

    def __len__(self) -> int:
        return len(self._entries)

    def admit(self, nonce: str, expires_at: float) -> list[str]:
        """Start an import for ``nonce``; returns the nonces whose imports expired meanwhile (drop them)."""
        if not isinstance(nonce, str) or not 16 <= len(nonce) <= 128:
            raise HandoverError("invalid", "a hand-over nonce is a string of 16-128 characters")
        dropped = self.expire()
        now = self._clock()
        if nonce in self._entries:
            raise HandoverError("replay", f"offer {nonce[:16]}... was used before ({self._entries[nonce].state.value})")
        if expires_at <= now:
            raise HandoverError("expired", f"the offer expired {now - expires_at:.1f} s ago")
        if len(self._entries) >= self.max_entries:
            raise HandoverError("capacity", f"{self.max_entries} hand-overs are remembered; try again later")
        self._entries[nonce] = _Entry(HandoverState.IMPORTING, float(expires_at))
        return dropped

    def imported(self, nonce: str) -> None:
        """The state is in place (not served): IMPORTING -> PENDING."""
        e = self._get(nonce)
        if e.state is not HandoverState.IMPORTING:
            raise HandoverError(e.state.value, f"hand-over {nonce[:16]}... is {e.state.value}, not importing")
        e.state = HandoverState.PENDING

    def commit(self, nonce: str) -> None:
        """PENDING -> COMMITTED (serve it now); refused when aborted or expired."""
        self.expire()
        e = self._get(nonce)
        if e.state is HandoverState.COMMITTED:
            return  # a retried commit: idempotent
        if e.state is not HandoverState.PENDING:
            raise HandoverError(e.state.value, f"hand-over {nonce[:16]}... is {e.state.value}: it cannot be committed")
        e.state = HandoverState.COMMITTED

    def abort(self, nonce: str, expires_at: float | None = None) -> bool:
        """Drop an import: True when there was one to drop (IMPORTING/PENDING), False when there was
        none (unknown: recorded ABORTED until ``expires_at``, or already aborted). ``committed`` if the
        receiver already serves it."""
        self.expire()
        e = self._entries.get(nonce)
        if e is None:
            until = expires_at if expires_at is not None else self._clock()
            # Remember it, so the offer cannot come late; but only within the window an entry is
            # remembered at all: past it, the nonce may be one this ledger committed and forgot,
            # which must never read as aborted (and a late offer is refused as expired anyway).
            if len(self._entries) < self.max_entries and until + self.remember_s > self._clock():
                self._entries[nonce] = _Entry(HandoverState.ABORTED, float(until))
            return False
        if e.state is HandoverState.COMMITTED:
            raise HandoverError("committed", f"hand-over {nonce[:16]}... is committed: the receiver serves it")
        had = e.state in (HandoverState.IMPORTING, HandoverState.PENDING)
        e.state = HandoverState.ABORTED
        return had

    def expire(self) -> list[str]:
        """Abort IMPORTING/PENDING entries past their expiry (returned: drop their state); forget
        entries past expiry + ``remember_s``."""
        now = self._clock()
        dropped = []
        for nonce, e in list(self._entries.items()):
            if e.expires_at <= now and e.state in (HandoverState.IMPORTING, HandoverState.PENDING):
                e.state = HandoverState.ABORTED
                dropped.append(nonce)
            if e.expires_at + self.remember_s <= now:
                del self._entries[nonce]
        return dropped

    def check_integrity(self) -> None:
        assert len(self._entries) <= self.max_entries
        for nonce, e in self._entries.items():
            assert isinstance(e.state, HandoverState), nonce

    def _get(self, nonce: str) -> _Entry:
        e = self._entries.get(nonce)
        if e is None:
            raise HandoverError("unknown", f"no hand-over {nonce[:16]}...")
        return e
