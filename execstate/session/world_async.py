"""Deprecated path: moved to ``execstate.session.world.async_world`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.world.async_world import (  # noqa: F401
    AsyncWorld,
)

__all__ = ['AsyncWorld']

moved("execstate.session.world_async", "execstate.session.world.async_world")
