"""Deprecated shim: ``execstate.serve.world_conn`` moved to ``execstate.serve.realtime.world.handlers``
(this path works for one release); ``WorldConnection(host, emit, emit_chunk)`` is now a framework
``Connection`` with ``WorldHandlers``."""

import warnings

from execstate.serve.realtime.connection import Connection, Emit, EmitBinary
from execstate.serve.realtime.world.handlers import *  # noqa: F403
from execstate.serve.realtime.world.handlers import WorldHandlers
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.messages import WORLD_PROTOCOL


def WorldConnection(host: WorldHost, emit: Emit, emit_chunk: EmitBinary) -> Connection:  # noqa: N802 - old name
    return Connection(WORLD_PROTOCOL, lambda peer: WorldHandlers(peer, host), emit, emit_chunk)


warnings.warn("execstate.serve.world_conn moved to execstate.serve.realtime.world.handlers", DeprecationWarning,
              stacklevel=2)
