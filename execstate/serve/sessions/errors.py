"""Session and migration errors over HTTP: an OpenAI-style body whose ``code`` is the session
error's code, with the HTTP status ``STATUS`` gives it."""

from __future__ import annotations

from execstate.serve.errors import OpenAIError
from execstate.session.runtime.events import SessionEventError

STATUS = {
    "invalid": 400, "unauthorized": 403, "target_not_allowed": 403, "wrong_target": 403, "not_found": 404,
    "busy": 409, "conflict": 409, "failed": 409, "session_in_use": 409, "replay": 409, "aborted": 409,
    "stale_state": 409, "incompatible": 409, "stale": 409, "closed": 410, "evicted": 410, "expired": 410,
    "capacity": 429, "quota": 429, "checkpoint_limit": 429, "backpressure": 429, "unsupported": 400,
    "timeout": 504, "internal": 500, "desync": 409, "hibernated": 409, "unavailable": 503,
}
"""HTTP status of each session / migration error code; any other code (a transfer error, a
``route_mismatch``, ``unreachable``, ``refused``) is 502: the other instance or the path to it failed.
``unsupported`` (an operation this server was not started for: migration without a PD connector,
hibernation without a tier) is a 400: the request must go elsewhere; the server did nothing wrong."""


def http_status(code: str) -> int:
    return STATUS.get(code, 502)


def session_error(e: SessionEventError) -> OpenAIError:
    return OpenAIError(http_status(e.code), e.message, code=e.code)
