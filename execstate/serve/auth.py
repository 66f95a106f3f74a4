"""Who calls: API keys (``--api-key`` repeated, ``--api-keys-file``) -> the caller's tenant, on every
``/v1`` path (DESIGN 11).

HTTP: ``Authorization: Bearer <key>``. WebSocket (``/v1/realtime...``): the same header, or, for
browsers (which cannot set headers on a WebSocket), the subprotocol
``openai-insecure-api-key.<key>`` among those offered, as OpenAI's Realtime API accepts it. A
refused WebSocket gets an HTTP 401 with the OpenAI error body before the upgrade (close code
1008 instead where the ASGI server cannot send an HTTP response); its socket is never accepted,
and the refusal is one INFO line with the reason (``ws_refusal.py``).

The key's tenant (``serve/principals.py``'s ``KeyRing``) is put in the ASGI scope
(:data:`TENANT_KEY`; :func:`scope_tenant` reads it): every surface resolves session ids in that
tenant's namespace from there, the realtime framework once per connection
(``serve/realtime/endpoint.py``), the session API once per request (``serve/sessions/routes.py``).
Without any key the server is open, every caller is the local tenant (``identity/tenant.py``), as
before keys existed.

Server-to-server paths (``peer_paths``: the session hand-over's import, commit and abort) take no
bearer key: their bodies are signed with the instances' shared secret and checked by their
routes (``serve/sessions/handover.py``); a source never forwards its client's key.

A pure ASGI middleware (runs before body parsing, never wraps streaming responses);
``/health`` and ``/metrics`` stay open, as in vLLM (``/metrics`` names tenants, never keys).
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from execstate.identity.tenant import LOCAL_TENANT, TenantId
from execstate.serve.errors import OpenAIError
from execstate.serve.principals import KeyRing
from execstate.serve.ws_refusal import CLOSE_POLICY_VIOLATION, install_log_filter, refuse_websocket

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
__all__ = ["CLOSE_POLICY_VIOLATION", "KEY_SUBPROTOCOL_PREFIX", "TENANT_KEY", "APIKeyMiddleware", "scope_tenant"]
TENANT_KEY = "execstate.tenant"
BEARER = "bearer "


def scope_tenant(scope: Scope) -> TenantId:
    """The caller's tenant, as the middleware found it (the local tenant on an app without it)."""
    tenant = scope.get(TENANT_KEY)
    return tenant if tenant is not None else LOCAL_TENANT


class APIKeyMiddleware:
    """``keys`` (or one ``api_key``, tenant ``default``) guard ``/v1``; ``peer_paths`` are signed instead."""

    def __init__(self, app: ASGIApp, api_key: str | None = None, keys: KeyRing | None = None,
                 peer_paths: Collection[str] = ()) -> None:
        self.app = app
        self.keys = keys if keys is not None else KeyRing.build([api_key] if api_key else [])
        self.peer_paths = frozenset(peer_paths)
        install_log_filter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind in ("http", "websocket") and scope["path"].startswith("/v1"):
            if kind == "http" and (scope["method"] == "OPTIONS" or (
                    scope["method"] == "POST" and scope["path"] in self.peer_paths)):
                await self.app(scope, receive, send)
                return
            tenant = self.keys.tenant_of(self._header_key(scope))
            if tenant is None and kind == "websocket":
                tenant = self._subprotocol_tenant(scope)
            if tenant is None:
                if kind == "http":
                    await _refusal("send 'Authorization: Bearer <key>'").response()(scope, receive, send)
                else:
                    await _refuse_websocket(scope, receive, send)
                return
            scope[TENANT_KEY] = tenant
        await self.app(scope, receive, send)

    @staticmethod
    def _header_key(scope: Scope) -> str | None:
        given = Headers(scope=scope).get("authorization", "")
        return given[len(BEARER):] if given[:len(BEARER)].lower() == BEARER else None

    def _subprotocol_tenant(self, scope: Scope) -> TenantId | None:
        for p in scope.get("subprotocols") or []:
            if p.startswith(KEY_SUBPROTOCOL_PREFIX):
                tenant = self.keys.tenant_of(p[len(KEY_SUBPROTOCOL_PREFIX):])
                if tenant is not None:
                    return tenant
        return None


def _refusal(how: str) -> OpenAIError:
    return OpenAIError(401, f"Incorrect or missing API key: {how}", code="invalid_api_key")


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    err = _refusal(f"send 'Authorization: Bearer <key>' or the subprotocol '{KEY_SUBPROTOCOL_PREFIX}<key>'")
    await refuse_websocket(scope, receive, send, err, "invalid API key")
