"""Deprecated shim: ``execstate.serve.agent_tools`` moved to
``execstate.serve.realtime.agent.tools`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.agent.tools import *  # noqa: F403

warnings.warn("execstate.serve.agent_tools moved to execstate.serve.realtime.agent.tools", DeprecationWarning,
              stacklevel=2)
