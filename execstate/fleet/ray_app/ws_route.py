"""Where a realtime WebSocket of the fleet goes, and what the ingress learns from its frames (pure).

The fleet's ingress proxies the replicas' realtime sockets (``ws_ingress.py``; docs/fleet.md,
"WebSockets"). This module is the part that needs no network and no Ray:

- :data:`WS_PATHS`: the sockets proxied (the engine replicas' app serves them: ``/v1/realtime``,
  ``/v1/realtime/agent``, ``/v1/voice/realtime``; a test checks they equal the serve modules'
  ``PATH``\\ s). ``/v1/realtime/video`` is the world server's, which is not a fleet replica.
- :func:`needs_first_frame`: on ``/v1/realtime`` the client speaks first and its first message
  says whether it attaches an existing session (``session.resume``), so the ingress reads it before
  choosing the replica; the other sockets open a new agent per connection (and the voice one
  speaks first), so they are placed at the handshake.
- :func:`first_frame_route`: the :class:`RouteRequest` of that first message: the replica holding
  the session for a ``session.resume`` of a session the ingress knows, else the router's choice
  (load; the message carries no prompt).
- :func:`session_change`: the sessions a ``/v1/realtime`` replica opened or closed, read from its
  events (``session.created`` / ``session.resumed`` / ``session.forked`` hold one there,
  ``session.closed`` ends it), so later HTTP calls and reconnects go to that replica.
- :func:`ws_credential`: the caller's credential as the session map keys it: the
  ``Authorization`` header, else the key a browser offers as the subprotocol
  ``openai-insecure-api-key.<key>`` (as ``Bearer <key>``: the same caller as the HTTP API's).
- Close codes: a replica's close code and reason pass through unchanged; a replica lost mid-connection
  (no close frame: killed, crashed) closes the client's socket with :data:`CLOSE_REPLICA_LOST`
  (1014, "bad gateway") and a reason naming the replica (:func:`lost_reason`); no replica able to
  take the connection: :data:`CLOSE_NO_REPLICA` (1013, "try again later"); a client's close code is
  passed to the replica when a close frame may carry it (:func:`sendable_close_code`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from execstate.fleet.router.policy import RouteRequest

LM_PATH = "/v1/realtime"
AGENT_PATH = "/v1/realtime/agent"
VOICE_PATH = "/v1/voice/realtime"
WS_PATHS = (LM_PATH, AGENT_PATH, VOICE_PATH)
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."  # as serve/auth.py accepts it
SUBPROTOCOL = "realtime"  # every realtime protocol's (serve/realtime/protocol.py)
CLOSE_REPLICA_LOST = 1014  # RFC 6455 registry: bad gateway
CLOSE_NO_REPLICA = 1013  # try again later
MAX_REASON_BYTES = 123  # a close frame's reason
_HELD = ("session.created", "session.resumed", "session.forked")
# hop-by-hop and handshake headers: the ingress's connection to the replica makes its own
_NOT_FORWARDED = frozenset({"host", "connection", "upgrade", "content-length", "transfer-encoding", "sec-websocket-key",
                            "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol",
                            "sec-websocket-accept"})


class Owners(Protocol):
    """What the route reads of the ingress's session map (``prompt_route.SessionReplicas``)."""

    def get(self, caller: str, session_id: str) -> str | None: ...


@dataclass(frozen=True)
class SessionChange:
    """A session a replica now holds for this connection (``held``) or closed (not ``held``)."""

    session_id: str
    held: bool


def needs_first_frame(path: str) -> bool:
    return path == LM_PATH


def first_frame_route(frame: str | bytes | None, caller: str, owners: Owners) -> RouteRequest:
    """The route of a ``/v1/realtime`` connection from its first client message (module docstring)."""
    if not isinstance(frame, str) or '"session.resume"' not in frame:
        return RouteRequest()
    try:
        msg = json.loads(frame)
    except ValueError:
        return RouteRequest()  # the replica answers invalid_message
    if not isinstance(msg, dict) or msg.get("type") != "session.resume" or not isinstance(msg.get("session_id"), str):
        return RouteRequest()
    return RouteRequest(session_replica=owners.get(caller, msg["session_id"]))


def session_change(frame: str) -> SessionChange | None:
    """The session a ``/v1/realtime`` server event opened, attached or closed; None for any other
    (checked on the event's head first: a delta is not parsed)."""
    head = frame[:48]
    if '"session.' not in head or not any(f'"{t}"' in head for t in (*_HELD, "session.closed")):
        return None
    try:
        event = json.loads(frame)
    except ValueError:
        return None
    kind = event.get("type") if isinstance(event, dict) else None
    if kind == "session.closed":
        sid = event.get("session_id")
        return SessionChange(sid, False) if isinstance(sid, str) else None
    if kind in _HELD and isinstance(event.get("session"), dict):
        sid = event["session"].get("session_id")
        return SessionChange(sid, True) if isinstance(sid, str) else None
    return None


def ws_credential(authorization: str | None, subprotocols: list[str]) -> str | None:
    """The credential a connection presents (module docstring), in the ``Authorization`` form."""
    if authorization:
        return authorization
    for p in subprotocols:
        if p.startswith(KEY_SUBPROTOCOL_PREFIX) and len(p) > len(KEY_SUBPROTOCOL_PREFIX):
            return "Bearer " + p[len(KEY_SUBPROTOCOL_PREFIX):]
    return None


def accepted_subprotocol(offered: list[str]) -> str | None:
    """The subprotocol a replica selects among ``offered`` (``realtime`` when offered)."""
    return SUBPROTOCOL if SUBPROTOCOL in offered else None


def forwarded_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The handshake's headers the replica gets (authorization and the rest; not the handshake's own)."""
    return [(k, v) for k, v in headers if k.lower() not in _NOT_FORWARDED]


def sendable_close_code(code: int | None) -> int:
    """``code`` when a close frame may carry it, else 1000 (1005, 1006 and 1015 are never sent)."""
    if code is not None and (code in (1000, 1001, 1002, 1003) or 1007 <= code <= 1014 or 3000 <= code <= 4999):
        return code
    return 1000


def clip_reason(reason: str) -> str:
    """``reason`` cut to what a close frame carries (123 bytes of UTF-8, whole characters)."""
    data = reason.encode()
    if len(data) <= MAX_REASON_BYTES:
        return reason
    return data[:MAX_REASON_BYTES].decode(errors="ignore")


def lost_reason(replica_id: str) -> str:
    """The close reason of a replica lost mid-connection, naming it (clipped to a close frame's size)."""
    return clip_reason(f"the replica serving this connection failed: {replica_id}")
