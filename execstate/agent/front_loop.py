"""Deprecated: ``DuplexAgent``'s loop now lives in ``agent/duplex.py`` with its collaborators
(``agent/front_context.py``, ``agent/delegations.py``); ``AgentError``, ``AgentStats`` and
``Interrupt`` moved to ``agent/errors.py``. This module re-exports them for one release."""

from __future__ import annotations

import warnings

from execstate.agent.errors import AgentError, AgentStats, Interrupt

__all__ = ["AgentError", "AgentStats", "Interrupt"]

warnings.warn("execstate.agent.front_loop is deprecated: import AgentError, AgentStats and Interrupt from "
              "execstate.agent.errors", DeprecationWarning, stacklevel=2)
