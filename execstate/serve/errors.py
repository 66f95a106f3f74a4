"""OpenAI-style errors: every failure is ``{"error": {"message", "type", "param", "code"}}``.

Status codes: 400 malformed JSON, bad or unsupported parameter, bad prompt (too long,
token ids outside the vocabulary, empty, beyond a ``ServingLimits`` bound); 401 missing or
wrong API key; 404 unknown model or path; 413 body larger than ``--max-request-bytes``;
429 waiting queue full (with ``Retry-After``); 500 the engine step serving this request
failed (the server goes on); 503 the engine is dead. Every 4xx has ``type``
``invalid_request_error`` (the request, not the server, must change: a 410 ``expired`` session
too), every 5xx ``server_error``, unless the raiser names another type. FastAPI's 422 validation errors
are mapped to 400.

**One code -> status table for every surface.** A :class:`~execstate.errors.CodedError` (a
session's, a migration's, a hand-over's, an agent's refusal) reaches an HTTP client as an error body
whose ``code`` is the error's code, with the status ``STATUS`` gives it (:func:`http_error`). Every
code a ``CodedError`` of the package raises is listed (``tests/serve/test_error_status.py`` scans
the package for them); a code not listed (another server's own code relayed back) is 502: the
other instance, or the path to it, failed.

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

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from execstate.errors import CodedError
from execstate.transfer.errors import ErrorCode


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class OpenAIError(Exception):
    """An error returned to the client with its HTTP status."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if 400 <= status < 500 else "server_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def param_of(message: str) -> str | None:
    """The parameter a ``SamplingParams`` ValueError names ("invalid sampling parameter X: ...")."""
    prefix = "invalid sampling parameter "
    if message.startswith(prefix):
        return message[len(prefix) :].split(":", 1)[0]
    if message.startswith(("prompt", "routed_experts")):
        return message.split(" ", 1)[0]
    return None


def _validation_error(exc: RequestValidationError) -> OpenAIError:
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return bad_request(f"malformed JSON body: {first.get('msg', '')}")
    if not loc:
        return bad_request(f"the request body must be a JSON object: {first.get('msg', '')}")
    same_field = [e for e in errors if tuple(e.get("loc", ()))[1:2] == (loc[0],)]
    if loc[0] in _HINTS and len(same_field) > 1:  # a union field: one error per alternative is noise
        return bad_request(f"{loc[0]} {_HINTS[loc[0]]}", param=loc[0])
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return bad_request(f"{first.get('msg', 'invalid value')} ({'.'.join(loc)}){more}", param=loc[0])


_HINTS = {
    "prompt": "must be a string, a list of token ids, a list of strings or a list of token-id lists",
    "stop": "must be a string or a list of strings",
    "messages": "must be a list of {'role': str, 'content': str | list of text parts}",
}


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


def install_error_handlers(app: FastAPI) -> None:
    async def on_openai(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return exc.response()

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _validation_error(exc).response()

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = "not_found" if exc.status_code == 404 else None
        return OpenAIError(exc.status_code, str(exc.detail), code=code).response()

    app.add_exception_handler(OpenAIError, on_openai)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
