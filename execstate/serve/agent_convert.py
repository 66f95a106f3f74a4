"""Deprecated shim: ``execstate.serve.agent_convert`` moved to
``execstate.serve.realtime.agent.convert`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.agent.convert import *  # noqa: F403

warnings.warn("execstate.serve.agent_convert moved to execstate.serve.realtime.agent.convert", DeprecationWarning,
              stacklevel=2)
