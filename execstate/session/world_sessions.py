"""Deprecated path: moved to ``execstate.session.world.sessions`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.world.sessions import (  # noqa: F401
    WorldSessionInfo,
    WorldSessions,
)

__all__ = ['WorldSessionInfo', 'WorldSessions']

moved("execstate.session.world_sessions", "execstate.session.world.sessions")
