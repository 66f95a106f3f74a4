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
request). Errors from either side are passed through with their status code.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

_FORWARD_HEADERS = ("authorization", "content-type")


def _error(status: int, message: str, code: str) -> JSONResponse:
    body = {"error": {"message": message, "type": "proxy_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request as sent to the prefill instance: one token, no stream, export on."""
    p = {k: v for k, v in body.items() if k not in ("stream_options", "max_completion_tokens", "n")}
    p.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    return p


def build_proxy_app(prefill: list[str], decode: list[str], timeout_s: float = 600.0) -> FastAPI:
    if not prefill or not decode:
        raise ValueError("the proxy needs at least one --prefill and one --decode URL")
    app = FastAPI(title="execstate PD proxy")
    next_p = itertools.cycle([u.rstrip("/") for u in prefill]).__next__
    next_d = itertools.cycle([u.rstrip("/") for u in decode]).__next__
    client = httpx.AsyncClient(timeout=timeout_s)

    @app.on_event("shutdown")
    async def _close() -> None:
        await client.aclose()

    async def handle(request: Request, path: str) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not valid JSON", "invalid_json")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "invalid_request")
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
        p_url, d_url = next_p(), next_d()
        try:
            p_resp = await client.post(p_url + path, json=prefill_body(body), headers=headers)
        except httpx.HTTPError as e:
            return _error(502, f"prefill instance {p_url} unreachable: {e!r}", "prefill_unreachable")
        if p_resp.status_code != 200:
            return Response(p_resp.content, status_code=p_resp.status_code, media_type="application/json")
        kv = p_resp.json().get("kv_transfer_params")
        if not isinstance(kv, dict):
            return _error(502, f"prefill instance {p_url} returned no kv_transfer_params", "no_handoff")
        d_body = dict(body, kv_transfer_params=kv)
        if not body.get("stream"):
            try:
                d_resp = await client.post(d_url + path, json=d_body, headers=headers)
            except httpx.HTTPError as e:
                return _error(502, f"decode instance {d_url} unreachable: {e!r}", "decode_unreachable")
            return Response(d_resp.content, status_code=d_resp.status_code, media_type="application/json")
        req = client.build_request("POST", d_url + path, json=d_body, headers=headers)
        try:
            d_resp = await client.send(req, stream=True)
        except httpx.HTTPError as e:
            return _error(502, f"decode instance {d_url} unreachable: {e!r}", "decode_unreachable")
        if d_resp.status_code != 200:
            content = await d_resp.aread()
            await d_resp.aclose()
            return Response(content, status_code=d_resp.status_code, media_type="application/json")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in d_resp.aiter_raw():
                    yield chunk
            finally:  # client gone or stream done: closing aborts the decode request upstream
                await d_resp.aclose()

        return StreamingResponse(relay(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await handle(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARD_HEADERS}
        r = await client.get(next_d() + "/v1/models", headers=headers)
        return Response(r.content, status_code=r.status_code, media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        bad = []
        for url in [*prefill, *decode]:
            try:
                r = await client.get(url.rstrip("/") + "/health", timeout=5.0)
                if r.status_code != 200:
                    bad.append(url)
            except httpx.HTTPError:
                bad.append(url)
        if bad:
            return JSONResponse({"status": "unhealthy", "instances": bad}, status_code=503)
        return JSONResponse({"status": "ok"})

    return app


def run_proxy(args: argparse.Namespace) -> int:
    import uvicorn

    app = build_proxy_app(args.prefill, args.decode)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
