"""Deprecated path: moved to ``execstate.session.lm.async_sessions`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.async_sessions import (  # noqa: F401
    AsyncSessions,
)

__all__ = ['AsyncSessions']

moved("execstate.session.async_sessions", "execstate.session.lm.async_sessions")
