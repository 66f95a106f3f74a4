"""OpenAI-style errors: every failure is ``{"error": {"message", "type", "param", "code"}}``.

Status codes: 400 malformed JSON, bad or unsupported parameter, bad prompt (too long,
token ids outside the vocabulary, empty, beyond a ``ServingLimits`` bound); 401 missing or
wrong API key; 404 unknown model or path; 413 body larger than ``--max-request-bytes``;
429 waiting queue full (with ``Retry-After``); 500 the engine step serving this request
failed (the server goes on); 503 the engine is dead. Every 4xx has ``type``
``invalid_request_error`` (the request, not the server, must change: a 410 ``expired`` session
too), every 5xx ``server_error``, unless the raiser names another type. FastAPI's 422 validation errors
are mapped to 400.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException


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
