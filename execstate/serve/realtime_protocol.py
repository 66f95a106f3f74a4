"""Deprecated shim: ``execstate.serve.realtime_protocol`` moved to
``execstate.serve.realtime.lm.messages`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.errors import EventId as ClientEventId  # noqa: F401
from execstate.serve.realtime.errors import ProtocolError, error_event  # noqa: F401
from execstate.serve.realtime.limits import MAX_MESSAGE_BYTES  # noqa: F401
from execstate.serve.realtime.lm.messages import *  # noqa: F403
from execstate.serve.realtime.lm.messages import LM_PROTOCOL as _PROTOCOL
from execstate.serve.realtime.messages import type_of  # noqa: F401

CLIENT_TYPES = _PROTOCOL.messages.types
parse_client_message = _PROTOCOL.parse

warnings.warn("execstate.serve.realtime_protocol moved to execstate.serve.realtime.lm.messages", DeprecationWarning,
              stacklevel=2)
