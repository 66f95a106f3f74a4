"""Deprecated shim: ``execstate.serve.agent_protocol`` moved to
``execstate.serve.realtime.agent.messages`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.agent.messages import *  # noqa: F403
from execstate.serve.realtime.agent.messages import AGENT_PROTOCOL as _PROTOCOL
from execstate.serve.realtime.messages import server_event, type_of  # noqa: F401

CLIENT_TYPES = _PROTOCOL.messages.types
parse_client_message = _PROTOCOL.parse

warnings.warn("execstate.serve.agent_protocol moved to execstate.serve.realtime.agent.messages", DeprecationWarning,
              stacklevel=2)
