"""Deprecated shim: ``execstate.serve.agent_ws`` moved to
``execstate.serve.realtime.agent.endpoint`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.agent.endpoint import *  # noqa: F403

warnings.warn("execstate.serve.agent_ws moved to execstate.serve.realtime.agent.endpoint", DeprecationWarning,
              stacklevel=2)
