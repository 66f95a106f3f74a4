"""Deprecated path: moved to ``execstate.session.lm.offline`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.offline import (  # noqa: F401
    Checkpoint,
    Session,
    SessionEventError,
    StepResult,
)

__all__ = ['Checkpoint', 'Session', 'SessionEventError', 'StepResult']

moved("execstate.session.offline", "execstate.session.lm.offline")
