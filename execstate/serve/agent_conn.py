"""Deprecated shim: ``execstate.serve.agent_conn`` moved to ``execstate.serve.realtime.agent.handlers``
(this path works for one release); ``AgentConnection(server, emit)`` is now a framework
``Connection`` with ``AgentHandlers``."""

import warnings
from typing import Any

from execstate.serve.realtime.agent.handlers import *  # noqa: F403
from execstate.serve.realtime.agent.handlers import AgentHandlers
from execstate.serve.realtime.agent.messages import AGENT_PROTOCOL, LEDGER_CODES  # noqa: F401
from execstate.serve.realtime.connection import Connection, Emit


def AgentConnection(server: Any, emit: Emit) -> Connection:  # noqa: N802 - the old class name
    return Connection(AGENT_PROTOCOL, lambda peer: AgentHandlers(peer, server), emit)


warnings.warn("execstate.serve.agent_conn moved to execstate.serve.realtime.agent.handlers", DeprecationWarning,
              stacklevel=2)
