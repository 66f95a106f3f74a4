"""Who calls: API keys (``--api-key`` repeated, ``--api-keys-file``) -> the caller's tenant, on every
path of a keyed server but the public ones (docs/security.md).

Public (answered without a key): ``GET /health``; the browser pages and their scripts (``/``, the
``/world`` and ``/agent`` pages, ``/api-key.js``, the docs site under ``/docs/``), which a browser
cannot send a key to on navigation and which show nothing a keyless caller should not learn (no
model list: ``landing.py``; the pages ask for the key and offer it on their WebSocket,
``static/api-key.js``); ``GET /metrics`` only when the operator says so (``--public-metrics``:
it names tenants, never keys). Everything else needs a key, the API (``/v1/...``, ``/tokenize``,
``/detokenize``, ``/tokenizer_info``, ``/version``) and unknown paths alike, so a keyless caller
cannot even enumerate routes. Each page's installer adds its paths to the app's
:class:`PublicPaths` (:func:`public_paths`).

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

A pure ASGI middleware (runs before body parsing, never wraps streaming responses): an
unauthenticated body is never read.
"""

from __future__ import annotations

from collections.abc import Collection

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from execstate.identity.tenant import LOCAL_TENANT, TenantId
from execstate.serve.errors import OpenAIError
from execstate.serve.principals import KeyRing
from execstate.serve.ws_refusal import CLOSE_POLICY_VIOLATION, install_log_filter, refuse_websocket

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
__all__ = ["CLOSE_POLICY_VIOLATION", "KEY_SUBPROTOCOL_PREFIX", "TENANT_KEY", "APIKeyMiddleware", "PublicPaths",
           "public_paths", "scope_tenant"]
TENANT_KEY = "execstate.tenant"
BEARER = "bearer "


def scope_tenant(scope: Scope) -> TenantId:
    """The caller's tenant, as the middleware found it (the local tenant on an app without it)."""
    tenant = scope.get(TENANT_KEY)
    return tenant if tenant is not None else LOCAL_TENANT


class PublicPaths:
    """The paths a keyed server answers without a key to ``GET`` (and ``HEAD``): exact paths and
    path prefixes (a mounted site). One per app (:func:`public_paths`)."""

    def __init__(self, paths: Collection[str] = ("/health",)) -> None:
        self._paths = set(paths)
        self._prefixes: set[str] = set()

    def add(self, *paths: str) -> None:
        self._paths.update(paths)

    def add_prefix(self, prefix: str) -> None:
        """Every path under ``prefix`` (``/docs`` -> ``/docs`` and ``/docs/...``)."""
        self._prefixes.add(prefix.rstrip("/"))

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        return path in self._paths or any(path == p or path.startswith(p + "/") for p in self._prefixes)


def public_paths(app: FastAPI) -> PublicPaths:
    """``app``'s public paths (created with ``/health`` on first use): page installers add theirs."""
    found = getattr(app.state, "public_paths", None)
    if found is None:
        found = app.state.public_paths = PublicPaths()
    assert isinstance(found, PublicPaths)
    return found


class APIKeyMiddleware:
    """``keys`` (or one ``api_key``, tenant ``default``) guard every path but ``public`` (``GET``
    only; default: ``/health``); ``peer_paths`` are signed instead."""

    def __init__(self, app: ASGIApp, api_key: str | None = None, keys: KeyRing | None = None,
                 peer_paths: Collection[str] = (), public: PublicPaths | None = None) -> None:
        self.app = app
        self.keys = keys if keys is not None else KeyRing.build([api_key] if api_key else [])
        self.peer_paths = frozenset(peer_paths)
        self.public = public if public is not None else PublicPaths()
        install_log_filter()

    def _exempt(self, scope: Scope) -> bool:
        if scope["type"] != "http":
            return False
        method, path = scope["method"], scope["path"]
        return (method == "OPTIONS" or (method == "POST" and path in self.peer_paths)
                or (method in ("GET", "HEAD") and path in self.public))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind in ("http", "websocket") and not self._exempt(scope):
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
