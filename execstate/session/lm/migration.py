"""Offline session migration between two engines of one process (docs/ARCHITECTURE.md 6)::

    llm_a.engine.attach_pd(PDConfig(role="kv_both", secret=SECRET))   # both engines, same secret
    llm_b.engine.attach_pd(PDConfig(role="kv_both", secret=SECRET))
    s = llm_a.open_session(...); s.step(...)        # llm_a, llm_b: execstate.LLM
    s_b = s.migrate(llm_b)            # or migrate_session(s, llm_b) -> Migrated(session, result, seconds)
    s_b.step(...)                     # the same id, the next steps equal those s would have produced

Both engines need PD connectors (``LLMEngine.attach_pd``): the source one that exports
(``kv_producer`` or ``kv_both``), the target one that loads (``kv_consumer`` or ``kv_both``), with
the same handoff secret. The protocol and its checks are the source's and the target's
(``session/lm/migration_source.py``, ``session/lm/migration_target.py``); this driver runs both in the
caller's thread as the runtime's two-phase hand-over (``session/runtime/migration.py``): export,
import, poll the target until its load settled (or ``timeout_s`` passed), then close the source
session (success) or serve it again (failure). The target is an ``execstate.LLM`` (its
``sessions``) or an engine's ``LMSessions``.

Errors are :class:`MigrationError` (a ``SessionEventError``) with a ``code``; on any error the
source session is OPEN, unchanged and serving, and the target holds nothing of it.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from execstate.session.lm.migration_source import Outgoing, begin_export, finish_export
from execstate.session.lm.migration_target import ImportHandle, MigrationResult, begin_import
from execstate.session.lm.sessions import LMSessions
from execstate.session.runtime.handle import SessionHandle
from execstate.session.runtime.migration import MigrationError, hand_over

_POLL_SLEEP_S = 0.0005


class Migrated(NamedTuple):
    session: SessionHandle  # the session on the target (same id; an offline ``Session``)
    result: MigrationResult
    seconds: float  # the whole migration, source side


def lm_sessions_of(target: object) -> LMSessions:
    """``target`` itself if it is an ``LMSessions``, else its ``sessions`` (an ``execstate.LLM``)."""
    sessions = target if isinstance(target, LMSessions) else getattr(target, "sessions", None)
    if not isinstance(sessions, LMSessions):
        raise MigrationError("invalid", "the target is an execstate.LLM or an engine's LMSessions, got "
                             f"{type(target).__name__}")
    return sessions


def migrate_session(session: SessionHandle, target: object, timeout_s: float = 30.0) -> Migrated:
    """Move ``session`` (an offline ``Session``) to ``target`` (module docstring)."""
    src = session.sessions
    dst = lm_sessions_of(target)
    assert isinstance(src, LMSessions)
    if dst.engine is src.engine:
        raise MigrationError("invalid", "the target is the session's own engine")

    def deliver(out: Outgoing) -> MigrationResult:
        return wait_import(dst, begin_import(dst, out.payload), out)

    out, result = hand_over(lambda: begin_export(src, session.session_id, timeout_s), deliver,
                            lambda out, ok: finish_export(src, out, ok))
    moved = type(session)(dst, dst.manager.get(out.session_id))
    return Migrated(moved, result, time.monotonic() - out.started)


def wait_import(dst: LMSessions, handle: ImportHandle, out: Outgoing) -> MigrationResult:
    """Poll the target engine (its transfer thread's results) until the import settled, or abandon
    it at the offer's deadline; the result, or its ``MigrationError``."""
    while not handle.future.done():
        dst.engine.poll()
        if handle.future.done():
            break
        if time.time() > out.commit_by:
            handle.abandon(f"no answer within the migration window ({out.commit_by - time.time():.1f} s past)")
            break
        time.sleep(_POLL_SLEEP_S)
    return handle.future.result()
