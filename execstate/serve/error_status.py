"""The HTTP status of every error code: one table for every HTTP surface.

A :class:`~execstate.errors.CodedError` (a session's, a migration's, a hand-over's, an agent's
refusal) reaches an HTTP client as an OpenAI-style error body whose ``code`` is the error's code,
with the status ``STATUS`` gives it (:func:`http_error`). Every code a ``CodedError`` of the package
raises is listed (``tests/serve/test_error_status.py`` scans the package for them); a code not
listed (another server's own code relayed back) is 502: the other instance, or the path to it,
failed.

- 400: the request must change (``invalid``) or go elsewhere (``unsupported``: an operation this
  server was not started for, migration without a PD connector, hibernation without a tier; the
  server did nothing wrong); 403: not allowed (``unauthorized``, ``target_not_allowed``,
  ``wrong_target``); 404: no such thing (``not_found``, ``unknown``);
- 409: the state of the session or the hand-over refuses it now (``busy``, ``session_in_use``,
  ``replay``, ``committed``...); 410: gone for good (``closed``, ``evicted``, ``expired``);
- 429: a bound (``capacity``, ``quota``, ``checkpoint_limit``, ``backpressure``);
- 500 ``internal``; 503 ``unavailable``, ``engine_dead``; 504 ``timeout``;
- 502: the other instance or the path to it failed: a transfer's codes (``ErrorCode``), a
  migration's ``refused``, ``unreachable``, ``route_mismatch``, ``commit_failed``...

:func:`relayed_status` is the status of a failure reported by another server during a migration
(the migrate endpoint): 502 whatever the other server said, except a ``timeout`` (504) and
``unsupported`` (400: the target cannot receive sessions).
"""

from __future__ import annotations

from execstate.errors import CodedError
from execstate.serve.errors import OpenAIError
from execstate.transfer.errors import ErrorCode

BAD_GATEWAY = 502

STATUS: dict[str, int] = {
    # a transfer failed on its way from or to the other instance (a few are more specific below)
    **{c.value: BAD_GATEWAY for c in ErrorCode},
    "invalid": 400, "unsupported": 400,
    "unauthorized": 403, "target_not_allowed": 403, "wrong_target": 403,
    "not_found": 404, "unknown": 404,
    "busy": 409, "conflict": 409, "failed": 409, "session_in_use": 409, "replay": 409, "aborted": 409,
    "committed": 409, "importing": 409, "pending": 409, "stale_state": 409, "incompatible": 409,
    "stale": 409, "desync": 409, "hibernated": 409, "budget": 409, "duplicate": 409, "late": 409,
    "closed": 410, "evicted": 410, "expired": 410,
    "capacity": 429, "quota": 429, "checkpoint_limit": 429, "backpressure": 429,
    "internal": 500,
    "unavailable": 503, "engine_dead": 503,
    "timeout": 504,
    "refused": BAD_GATEWAY, "unreachable": BAD_GATEWAY, "route_mismatch": BAD_GATEWAY,
    "commit_failed": BAD_GATEWAY, "cancelled": BAD_GATEWAY, "lost": BAD_GATEWAY,
}
"""The HTTP status of each error code (module docstring); any other code is 502."""

_RELAYED_KEEP = frozenset({"timeout", "unsupported"})


def status_of(code: str) -> int:
    """The HTTP status of ``code`` (``STATUS``; 502 for a code not listed)."""
    return STATUS.get(code, BAD_GATEWAY)


def relayed_status(code: str) -> int:
    """The status of a migration's failure reported by, or on the way to, another server."""
    return status_of(code) if code in _RELAYED_KEEP else BAD_GATEWAY


def http_error(e: CodedError) -> OpenAIError:
    """``e`` as an HTTP error: its code and message, with the status ``STATUS`` gives the code."""
    return OpenAIError(status_of(e.code), e.message, code=e.code)
