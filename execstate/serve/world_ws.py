"""Deprecated shim: ``execstate.serve.world_ws`` moved to
``execstate.serve.realtime.world.endpoint`` (this path works for one release)."""

import warnings

from execstate.serve.realtime.limits import (  # noqa: F401
    CLOSE_POLICY_VIOLATION,
    MAX_UNPROCESSED_MESSAGES,
    WRITER_DRAIN_S,
)
from execstate.serve.realtime.protocol import SUBPROTOCOL  # noqa: F401
from execstate.serve.realtime.world.endpoint import *  # noqa: F403
from execstate.serve.realtime.world.messages import (
    MAX_MESSAGE_BYTES,  # noqa: F401
    MAX_UNSENT,  # noqa: F401
)

warnings.warn("execstate.serve.world_ws moved to execstate.serve.realtime.world.endpoint", DeprecationWarning,
              stacklevel=2)
