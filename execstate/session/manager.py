"""Deprecated path: moved to ``execstate.session.runtime.manager`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.runtime.manager import (  # noqa: F401
    EVICTION_POLICIES,
    SESSION_ID_RE,
    SessionManager,
    check_session_id,
    new_session_id,
)

__all__ = ['EVICTION_POLICIES', 'SESSION_ID_RE', 'SessionManager', 'check_session_id', 'new_session_id']

moved("execstate.session.manager", "execstate.session.runtime.manager")
