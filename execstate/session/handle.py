"""Deprecated path: moved to ``execstate.session.runtime.handle`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.runtime.handle import (  # noqa: F401
    SessionHandle,
)
from execstate.session.runtime.sessions import (  # noqa: F401
    KindSessions,
)

SessionOps = KindSessions  # the protocol's name before issue 18: the shared sessions base

__all__ = ['KindSessions', 'SessionHandle', 'SessionOps']

moved("execstate.session.handle", "execstate.session.runtime.handle")
