"""PD proxy: ``execstate proxy --prefill URL... --decode URL...``.

For each ``/v1/completions`` or ``/v1/chat/completions`` request:

1. send it to a prefill instance (round robin) with ``max_tokens=1``, no streaming and
   ``kv_transfer_params={"do_remote_decode": true}``; the prefill instance exports the
   prompt's KV units (with their route records) and answers with handoff parameters;
2. send the original request to a decode instance (round robin) with those
   ``kv_transfer_params``; the decode instance pulls the KV and routes straight from
   the prefill instance (NIXL + control channel) and its answer is streamed back.

The proxy carries neither KV nor route arrays: the prefill reply it reads holds only
the handoff parameters (a prefill instance never returns routes for an exported
request). A client's own ``kv_transfer_params`` are never forwarded (stripped): only P's
handoff goes to D. With a secret (``--kv-secret`` or ``$EXECSTATE_KV_SECRET``, the one P
and D share) the proxy also checks P's signature and refuses (502) a handoff that fails.

Errors: every error the proxy answers is an OpenAI error body
``{"error": {"message", "type", "param", "code"}}`` with its status (400 bad body, 404/405
unknown route, 502 an instance unreachable or a missing/invalid handoff); an instance's own
error (already in that shape) is passed through with its status, anything else from an
instance is wrapped into it. ``GET /metrics`` and the per-request log line: ``proxy_metrics``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from execstate.identity.secret_ring import SecretRing
from execstate.serve.errors import OpenAIError, install_error_handlers
from execstate.serve.health import health_response
from execstate.serve.json_depth import depth_message, too_deep
from execstate.serve.pd.proxy_metrics import ProxyMetrics, ProxyRecord
from execstate.transfer.handoff import HandoffError, HandoffTrust, wants_remote_prefill

_FORWARD_HEADERS = ("authorization", "content-type")


def _error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    return OpenAIError(status, message, param=param, code=code).response()


def _upstream_error(resp: httpx.Response, content: bytes, stage: str, url: str) -> Response:
    """An instance's error: passed through when it is already an OpenAI error body, else wrapped."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return Response(content, status_code=resp.status_code, media_type="application/json")
    text = content.decode("utf-8", errors="replace")[:300]
    return _error(resp.status_code, f"{stage} instance {url} answered {resp.status_code}: {text}", f"{stage}_error")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request as sent to the prefill instance: one token, no stream, export on."""
    p = {k: v for k, v in body.items() if k not in ("stream_options", "max_completion_tokens", "n")}
    p.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    return p


class PDProxy:
    """The proxy's state (instances in round robin, the handoff trust, one HTTP client, the metrics)
    and its request path, one method per stage (module docstring)."""

    def __init__(self, prefill: list[str], decode: list[str], timeout_s: float = 600.0,
                 secret: str | bytes | None = None) -> None:
        if not prefill or not decode:
            raise ValueError("the proxy needs at least one --prefill and one --decode URL")
        ring = SecretRing.resolve(secret)
        self.trust = HandoffTrust(ring) if ring is not None else None
        self.client = httpx.AsyncClient(timeout=timeout_s)
        self.metrics = ProxyMetrics()
        self.instances = [*prefill, *decode]
        self.next_prefill = itertools.cycle([u.rstrip("/") for u in prefill]).__next__
        self.next_decode = itertools.cycle([u.rstrip("/") for u in decode]).__next__

    async def handle(self, request: Request, path: str, endpoint: str) -> Response:
        """One completions / chat request: P, then D (streamed back when the client asked)."""
        rec = ProxyRecord(self.metrics, f"proxy-{uuid.uuid4().hex}", endpoint)
        body = await _json_body(request, rec)
        if isinstance(body, Response):
            return body
        body = {k: v for k, v in body.items() if k != "kv_transfer_params"}  # only P's handoff goes to D
        rec.stream = bool(body.get("stream"))
        headers = _forwarded(request)
        headers["x-request-id"] = rec.request_id
        p_url, d_url = self.next_prefill(), self.next_decode()
        rec.prefill_url, rec.decode_url = p_url, d_url
        kv = await self._prefill(rec, p_url, path, body, headers)
        if isinstance(kv, Response):
            return kv
        d_body = dict(body, kv_transfer_params=kv)
        if rec.stream:
            return await self._decode_stream(rec, d_url, path, d_body, headers)
        return await self._decode(rec, d_url, path, d_body, headers)

    async def _prefill(self, rec: ProxyRecord, p_url: str, path: str, body: dict[str, Any],
                       headers: dict[str, str]) -> dict[str, Any] | Response:
        """P's handoff parameters (checked when the proxy has the secret), or the error to answer."""
        t0 = time.perf_counter()
        try:
            p_resp = await self.client.post(p_url + path, json=prefill_body(body), headers=headers)
        except httpx.HTTPError as e:
            rec.finish(502, "prefill")
            return _error(502, f"prefill instance {p_url} unreachable: {e!r}", "prefill_unreachable")
        rec.prefill_done(time.perf_counter() - t0)
        if p_resp.status_code != 200:
            rec.finish(p_resp.status_code, "prefill")
            return _upstream_error(p_resp, p_resp.content, "prefill", p_url)
        try:
            kv = p_resp.json().get("kv_transfer_params")
        except (ValueError, AttributeError):
            kv = None
        if not isinstance(kv, dict):
            rec.finish(502, "handoff")
            return _error(502, f"prefill instance {p_url} returned no kv_transfer_params", "no_handoff")
        if self.trust is not None and wants_remote_prefill(kv):
            try:
                self.trust.accept(kv)
            except HandoffError as e:
                rec.finish(502, "handoff")
                return _error(502, f"prefill instance {p_url} returned an invalid handoff: {e}", "invalid_handoff")
        return kv

    async def _decode(self, rec: ProxyRecord, d_url: str, path: str, body: dict[str, Any],
                      headers: dict[str, str]) -> Response:
        t1 = time.perf_counter()
        try:
            d_resp = await self.client.post(d_url + path, json=body, headers=headers)
        except httpx.HTTPError as e:
            rec.finish(502, "decode", time.perf_counter() - t1)
            return _error(502, f"decode instance {d_url} unreachable: {e!r}", "decode_unreachable")
        ok = d_resp.status_code == 200
        rec.finish(d_resp.status_code, None if ok else "decode", time.perf_counter() - t1)
        if not ok:
            return _upstream_error(d_resp, d_resp.content, "decode", d_url)
        return Response(d_resp.content, status_code=200, media_type="application/json")

    async def _decode_stream(self, rec: ProxyRecord, d_url: str, path: str, body: dict[str, Any],
                             headers: dict[str, str]) -> Response:
        t1 = time.perf_counter()
        req = self.client.build_request("POST", d_url + path, json=body, headers=headers)
        try:
            d_resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as e:
            rec.finish(502, "decode", time.perf_counter() - t1)
            return _error(502, f"decode instance {d_url} unreachable: {e!r}", "decode_unreachable")
        if d_resp.status_code != 200:
            content = await d_resp.aread()
            await d_resp.aclose()
            rec.finish(d_resp.status_code, "decode", time.perf_counter() - t1)
            return _upstream_error(d_resp, content, "decode", d_url)

        async def relay() -> AsyncIterator[bytes]:
            status, stage = 499, None  # 499: the client went away before the end
            try:
                async for chunk in d_resp.aiter_raw():
                    yield chunk
                status = 200
            except httpx.HTTPError:
                status, stage = 200, "decode"  # the stream broke after its 200 was sent
            finally:  # client gone or stream done: closing aborts the decode request upstream
                await d_resp.aclose()
                rec.finish(status, stage, time.perf_counter() - t1)

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def models(self, request: Request) -> Response:
        url = self.next_decode()
        try:
            r = await self.client.get(url + "/v1/models", headers=_forwarded(request))
        except httpx.HTTPError as e:
            return _error(502, f"decode instance {url} unreachable: {e!r}", "decode_unreachable")
        if r.status_code != 200:
            return _upstream_error(r, r.content, "decode", url)
        return Response(r.content, status_code=200, media_type="application/json")

    async def health(self) -> Response:
        bad = []
        for url in self.instances:
            try:
                r = await self.client.get(url.rstrip("/") + "/health", timeout=5.0)
                if r.status_code != 200:
                    bad.append(url)
            except httpx.HTTPError:
                bad.append(url)
        if bad:
            return JSONResponse({"status": "unhealthy", "instances": bad}, status_code=503)
        return health_response()


async def _json_body(request: Request, rec: ProxyRecord) -> dict[str, Any] | Response:
    depth = too_deep(await request.body())
    if depth is not None:
        rec.finish(400, "request")
        return _error(400, f"request body: {depth_message(depth)}", "invalid_message")
    try:
        body = await request.json()
    except ValueError:
        rec.finish(400, "request")
        return _error(400, "request body is not valid JSON", "invalid_json")
    if not isinstance(body, dict):
        rec.finish(400, "request")
        return _error(400, "request body must be a JSON object", "invalid_request")
    return body


def _forwarded(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}


def build_proxy_app(
    prefill: list[str], decode: list[str], timeout_s: float = 600.0, secret: str | bytes | None = None
) -> FastAPI:
    """``secret``: verify P's handoff signatures (``None``: ``$EXECSTATE_KV_SECRET``, else pass through)."""
    proxy = PDProxy(prefill, decode, timeout_s, secret)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.client.aclose()

    app = FastAPI(title="execstate PD proxy", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    install_error_handlers(app)
    app.state.metrics = proxy.metrics

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy.handle(request, "/v1/completions", "completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await proxy.handle(request, "/v1/chat/completions", "chat")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await proxy.models(request)

    @app.get("/health")
    async def health() -> Response:
        return await proxy.health()

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(proxy.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def run_proxy(args: argparse.Namespace) -> int:
    import uvicorn

    app = build_proxy_app(args.prefill, args.decode, secret=getattr(args, "kv_secret", None))
    logger = logging.getLogger("execstate.proxy")
    if not logger.handlers:  # one line per request on stderr
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
