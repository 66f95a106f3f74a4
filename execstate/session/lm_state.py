"""Deprecated path: moved to ``execstate.session.lm.state`` (issue 18); this shim goes in the next release."""

from execstate.session._moved import moved
from execstate.session.lm.state import (  # noqa: F401
    LMSaved,
    LMState,
)

__all__ = ['LMSaved', 'LMState']

moved("execstate.session.lm_state", "execstate.session.lm.state")
