"""Deprecated path: moved to ``execstate.session.world.state`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.world.state import (  # noqa: F401
    WorldControl,
    WorldSaved,
    WorldState,
    WorldStore,
    start_history,
    step_history,
)

__all__ = ['WorldControl', 'WorldSaved', 'WorldState', 'WorldStore', 'start_history', 'step_history']

moved("execstate.session.world_state", "execstate.session.world.state")
