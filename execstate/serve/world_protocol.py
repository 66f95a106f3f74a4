"""Deprecated shim: ``execstate.serve.world_protocol`` moved to
``execstate.serve.realtime.world.messages`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.errors import EventId as ClientEventId  # noqa: F401
from execstate.serve.realtime.errors import ProtocolError as WorldProtocolError  # noqa: F401
from execstate.serve.realtime.messages import type_of  # noqa: F401
from execstate.serve.realtime.world.messages import *  # noqa: F403
from execstate.serve.realtime.world.messages import WORLD_PROTOCOL as _PROTOCOL

CLIENT_TYPES = _PROTOCOL.messages.types
parse_client_message = _PROTOCOL.parse

warnings.warn("execstate.serve.world_protocol moved to execstate.serve.realtime.world.messages", DeprecationWarning,
              stacklevel=2)
