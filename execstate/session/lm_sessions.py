"""Deprecated path: moved to ``execstate.session.lm.sessions`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.sessions import (  # noqa: F401
    LMSessions,
    SessionInfo,
)

__all__ = ['LMSessions', 'SessionInfo']

moved("execstate.session.lm_sessions", "execstate.session.lm.sessions")
