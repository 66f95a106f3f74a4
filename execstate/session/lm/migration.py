"""Offline session migration between two engines of one process (docs/contracts.md 6)::

    llm_a = LLM(path, kv_transfer=PDConfig(role="kv_both", secret=SECRET))   # both engines, same secret
    llm_b = LLM(path, kv_transfer=PDConfig(role="kv_both", secret=SECRET))
    s = llm_a.open_session(...); s.step(...)        # llm_a, llm_b: execstate.LLM
    s_b = s.migrate(llm_b)            # or migrate_session(s, llm_b) -> Migrated(session, result, seconds)
    s_b.step(...)                     # the same id, the next steps equal those s would have produced

Both engines need PD connectors (``EngineConfig.kv_transfer``): the source one that exports
(``kv_producer`` or ``kv_both``), the target one that loads (``kv_consumer`` or ``kv_both``), with
the same handoff secret. The protocol and its checks are the source's and the target's
(``session/lm/migration_source.py``, ``session/lm/migration_target.py``); this driver runs both in the
caller's thread as the runtime's two-phase hand-over (``session/runtime/migration.py``): export
(an offer bound to the target engine and a fresh nonce), import (the target holds the session,
not serving it), poll the target until its load settled (or ``timeout_s`` passed), then close the
source session and commit the target's (success) or serve the source's again (failure: the
target dropped its import). The target is an ``execstate.LLM`` (its ``sessions``) or an engine's
``LMSessions``. Both engines need the same shared secret: every offer is signed.

Errors are :class:`MigrationError` (a ``SessionEventError``) with a ``code``; on any error the
source session is OPEN, unchanged and serving, and the target holds nothing of it.
"""

from __future__ import annotations

import secrets
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
    if dst.engine.pd is None:
        raise MigrationError("unsupported", "the target cannot receive sessions: it has no PD connector")
    imports: list[ImportHandle] = []

    def deliver(out: Outgoing) -> MigrationResult:
        imports.append(begin_import(dst, out.payload))
        return wait_import(dst, imports[0], out)

    target_id = dst.engine.pd.instance_id
    out, result = hand_over(lambda: begin_export(src, session.session_id, timeout_s, access=session.access,
                                                 target_engine_id=target_id, nonce=secrets.token_hex(16)),
                            deliver, lambda out, ok: finish_export(src, out, ok))
    imports[0].commit()  # the source's copy is closed: the target serves it from now on
    assert imports[0].runtime is not None
    moved = type(session)(dst, imports[0].runtime)
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
