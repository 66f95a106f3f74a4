"""Offline session migration between two engines of one process (docs/ARCHITECTURE.md 6)::

    llm_a.engine.attach_pd(PDConfig(role="kv_both", secret=SECRET))   # both engines, same secret
    llm_b.engine.attach_pd(PDConfig(role="kv_both", secret=SECRET))
    s = llm_a.open_session(...); s.step(...)
    s_b = s.migrate(llm_b)            # or migrate_session(s, llm_b) -> Migrated(session, result, seconds)
    s_b.step(...)                     # the same id, the next steps equal those s would have produced

Both engines need PD connectors (``LLMEngine.attach_pd``): the source one that exports
(``kv_producer`` or ``kv_both``), the target one that loads (``kv_consumer`` or ``kv_both``), with
the same handoff secret. The protocol and its checks are the source's and the target's
(``session/migration_source.py``, ``session/migration_target.py``); this driver runs both in the
caller's thread: export, import, poll the target until its load settled (or ``timeout_s``
passed), then close the source session (success) or serve it again (failure).

Errors are :class:`MigrationError` (a ``SessionEventError``) with a ``code``; on any error the
source session is OPEN, unchanged and serving, and the target holds nothing of it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

from execstate.engine.llm_engine import LLMEngine
from execstate.session.lm_sessions import LMSessions
from execstate.session.migration_source import Outgoing, begin_export, finish_export
from execstate.session.migration_target import ImportHandle, MigrationResult, begin_import
from execstate.session.migration_wire import MigrationError

if TYPE_CHECKING:
    from execstate.engine.llm import LLM
    from execstate.session.offline import Session

_POLL_SLEEP_S = 0.0005


class Migrated(NamedTuple):
    session: Session  # the session on the target (same id)
    result: MigrationResult
    seconds: float  # the whole migration, source side


def migrate_session(session: Session, target: LLM | LLMEngine, timeout_s: float = 30.0) -> Migrated:
    """Move ``session`` to ``target`` (module docstring)."""
    from execstate.session.offline import Session

    src = session._sessions.engine
    dst = target if isinstance(target, LLMEngine) else target.engine
    if dst is src:
        raise MigrationError("invalid", "the target is the session's own engine")
    out = begin_export(src, session.session_id, timeout_s)
    ok = False
    try:
        handle = begin_import(dst, out.payload)
        result = wait_import(dst, handle, out)
        ok = True
    finally:
        finish_export(src, out, ok)
    sessions = LMSessions.of(dst)
    return Migrated(Session(sessions, sessions.manager.get(out.session_id)), result, time.monotonic() - out.started)


def wait_import(dst: LLMEngine, handle: ImportHandle, out: Outgoing) -> MigrationResult:
    """Poll the target engine (its transfer thread's results) until the import settled, or abandon
    it at the offer's deadline; the result, or its ``MigrationError``."""
    while not handle.future.done():
        dst.poll()
        if handle.future.done():
            break
        if time.time() > out.commit_by:
            handle.abandon(f"no answer within the migration window ({out.commit_by - time.time():.1f} s past)")
            break
        time.sleep(_POLL_SLEEP_S)
    return handle.future.result()
