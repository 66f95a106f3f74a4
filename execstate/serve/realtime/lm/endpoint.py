"""``/v1/realtime``: LM sessions over a WebSocket (messages: ``messages.py``; docs/realtime.md).

The socket loop, its limits (1 MiB messages, 256 unprocessed messages or 8 MiB, 1024 unsent
events) and its error handling are the framework's (``serve/realtime/``); this module holds what
the app's connections share: one ``AsyncSessions`` over the engine, and ``SessionOwners``, which
knows which connection holds which session. When a socket goes, the response in progress is
cancelled and the connection's sessions are closed, or kept detached for ``--realtime-grace-s``
seconds (``owners.py``).

Ownership: each connection asks as ``realtime_access(tenant)``: its tenant's namespace of the
session API's realm, holder ``realtime``. A session it creates, forks or resumes is held by the
realtime kind of connection until it closes: the HTTP session API answers ``session_in_use`` for
it (reads included), another tenant ``not_found``, and an agent's front is not found at all (it
lives in the ``agents`` realm).
"""

from __future__ import annotations

from fastapi import FastAPI

from execstate.serve.context import ServeContext
from execstate.serve.realtime.connection import Peer
from execstate.serve.realtime.endpoint import Endpoint, mount
from execstate.serve.realtime.lm.handlers import LMHandlers, realtime_access
from execstate.serve.realtime.lm.messages import LM_PROTOCOL
from execstate.serve.realtime.lm.owners import SessionKey, SessionOwners

PATH = "/v1/realtime"
DEFAULT_GRACE_S = 0.0


class RealtimeServer:
    """The realtime endpoint of one app: its ``AsyncSessions``, the sessions' owners, the endpoint."""

    def __init__(self, ctx: ServeContext, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.ctx = ctx
        self.sessions = ctx.sessions
        self.owners = SessionOwners(self._close, grace_s)
        self.endpoint = Endpoint(LM_PROTOCOL, self.handlers)

    async def _close(self, key: SessionKey) -> bool:
        """Close a session no live connection holds any more (``owners.py``), as its tenant."""
        return await self.sessions.scoped(realtime_access(key[0])).close(key[1])

    def handlers(self, peer: Peer) -> LMHandlers:
        """The handlers of one new connection."""
        return LMHandlers(peer, self.sessions, self.owners, self.ctx.in_worker)

    @property
    def num_connections(self) -> int:
        return self.endpoint.num_connections


def install_realtime(app: FastAPI, ctx: ServeContext, grace_s: float = DEFAULT_GRACE_S) -> RealtimeServer:
    """Serve ``/v1/realtime`` on ``app`` (``app.state.realtime`` is the ``RealtimeServer``)."""
    server = RealtimeServer(ctx, grace_s)
    app.state.realtime = server
    mount(app, PATH, server.endpoint)
    return server
