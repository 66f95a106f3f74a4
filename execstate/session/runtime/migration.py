"""Session migration, the kind-agnostic part: its error and its two-phase hand-over (docs/contracts.md 6).

Moving a session to another instance is, for every kind, three calls in this order:

1. ``export()`` at the source: the session becomes MIGRATING (``SessionRuntime.begin_migration``:
   every call but ``close`` is refused, so the state sent is the state left behind) and its state
   is encoded into an offer;
2. ``deliver(out)``: the target checks the offer against its own model and creates the session
   under the same id and owner, **not serving it** (or raises, holding nothing of it);
3. ``finish(out, ok)`` at the source, always: ``ok`` (the target acknowledged) closes the
   source's session, and only then does the caller commit the target's (which serves it from
   then on); otherwise the target drops its import and the source's session is OPEN again,
   unchanged, and serves the next call.

So at most one instance serves a session at any time (docs/security.md). :func:`hand_over` runs the three
in one thread (``session/lm/migration.py`` commits after it); a server runs them across two
processes in the same order, with single-use signed offers and an abort that must be confirmed
before the source serves again (``serve/sessions/migration.py``, ``serve/sessions/handover.py``). The kinds' offers,
checks and transports:
``session/lm/migration*.py`` (KV through the PD connectors) and ``session/world/migration*.py``
(K/V inside the message); their shared wire parts: ``session/runtime/migration_wire.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from execstate.session.runtime.events import SessionEventError

Out = TypeVar("Out")
Result = TypeVar("Result")


class MigrationError(SessionEventError):
    """A migration failed or was refused; ``code`` says why (``session/lm/migration_wire.py`` lists
    them). The source session is unchanged and serving; the target holds nothing of it. A refusal
    by the session itself (``busy``, ``failed``, ``closed``, ``not_found``, ``stale_state``) keeps
    its code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)


def hand_over(export: Callable[[], Out], deliver: Callable[[Out], Result],
              finish: Callable[[Out, bool], None]) -> tuple[Out, Result]:
    """Export, deliver, then always finish (module docstring): what ``export`` and ``deliver``
    returned, or ``deliver``'s error once the source serves again."""
    out = export()
    ok = False
    try:
        result = deliver(out)
        ok = True
    finally:
        finish(out, ok)
    return out, result
