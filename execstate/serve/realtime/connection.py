"""One realtime connection without a server: frames in (``handle``), events out (``emit``).

:class:`Connection` is the dispatch loop's body, written once for every protocol. For each client
frame, in arrival order and one at a time (``endpoint.py`` feeds them):

1. a binary frame is refused (``invalid_message``: every message is one JSON text frame);
2. the frame is decoded (``RealtimeProtocol.parse``: ``message_too_large``, ``unknown_type``,
   ``invalid_message``);
3. the phase machine checks the message's type (``phases.py``: ``no_session``, ...);
4. the protocol's handler for the message's struct runs (``Handlers.routes``);
5. whatever it raises becomes one ``error`` event carrying the message's ``event_id``
   (``errors.py``; a bug is logged and answered ``server_error``): the connection stays open.

A message sent under a deprecated ``type`` (``messages.Renamed``) is acted on as its new type, and
from then on the connection sends the server events that answer it under their old names: the
handlers only ever emit the current names.

Once the socket is gone (``disconnected``), later frames are ignored; ``close`` (after the last
``handle``) enters GONE and lets the handlers release what the connection holds.

A protocol's handlers are built by the framework, once per connection, from a :class:`Peer`: the
connection's ``emit`` (a JSON event), ``emit_binary`` (an event, then a binary frame right after
it, nothing in between), ``state`` (its ``PhaseMachine``) and ``tenant``: the principal of the
connection (its API key's tenant, found once before the upgrade: ``serve/auth.py``). Every state a
protocol creates or reaches over the connection is that tenant's: handlers build their sessions
view from ``peer.tenant`` once (``AsyncKindSessions.scoped``), so ids resolve in the tenant's
namespace for every message, and no handler checks ownership itself. Their ``routes`` map every message
struct of the protocol to its handler (checked when the connection is built), and their
``close`` runs once, after the last message was handled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from execstate.identity.tenant import LOCAL_TENANT, TenantId
from execstate.serve.realtime.errors import EventId, ProtocolError, internal_error
from execstate.serve.realtime.messages import type_of
from execstate.serve.realtime.phases import GONE, PhaseMachine
from execstate.serve.realtime.protocol import RealtimeProtocol

Emit = Callable[[dict[str, Any]], Awaitable[None]]
EmitBinary = Callable[[dict[str, Any], bytes], Awaitable[None]]
Handler = Callable[[Any], Awaitable[None]]

BINARY_REFUSED = "binary frames are not accepted: send each message as one JSON text frame"

logger = logging.getLogger(__name__)


async def _no_binary(event: dict[str, Any], payload: bytes) -> None:
    raise RuntimeError("this connection was built without emit_binary")


@dataclass(frozen=True)
class Peer:
    """The connection as its handlers see it (module docstring)."""

    protocol: RealtimeProtocol
    emit: Emit
    emit_binary: EmitBinary
    state: PhaseMachine
    tenant: TenantId = LOCAL_TENANT

    async def emit_error(self, error: ProtocolError) -> None:
        """``error`` as an event in the protocol's shape."""
        await self.emit(self.protocol.error_event(error, self.state.values))


class Handlers(Protocol):
    """A protocol's handlers of one connection (module docstring)."""

    @property
    def routes(self) -> Mapping[type, Handler]: ...  # message struct -> its handler

    async def close(self) -> None: ...


class Connection:
    def __init__(self, protocol: RealtimeProtocol, open_handlers: Callable[[Peer], Handlers], emit: Emit,
                 emit_binary: EmitBinary | None = None, tenant: TenantId = LOCAL_TENANT) -> None:
        self.protocol = protocol
        self.state = PhaseMachine(protocol.phases)
        self.old_names: dict[str, str] = {}  # current server event type -> the deprecated one this client uses
        binary = emit_binary or _no_binary

        async def named_emit(event: dict[str, Any]) -> None:
            await emit(self._named(event))

        async def named_emit_binary(event: dict[str, Any], payload: bytes) -> None:
            await binary(self._named(event), payload)

        self.peer = Peer(protocol, named_emit, named_emit_binary, self.state, tenant)
        self.handlers = open_handlers(self.peer)
        routed, declared = set(self.handlers.routes), set(protocol.messages.messages)
        if routed != declared:
            raise ValueError(f"{protocol.name}: handlers for {sorted(t.__name__ for t in routed ^ declared)} "
                             "are missing or not the protocol's messages")

    async def handle(self, frame: str | bytes, binary: bool = False) -> None:
        """Act on one client frame (text, or ``binary``); every outcome is emitted, nothing raises."""
        if self.state.phase is GONE:
            return
        event_id: EventId = None
        try:
            if binary:
                raise ProtocolError("invalid_message", BINARY_REFUSED)
            msg, renamed = self.protocol.read(frame)
            if renamed is not None:
                self.old_names.update(renamed.answers)
            # every message struct declares its own event_id (messages.py); the base has none
            event_id = msg.event_id  # type: ignore[attr-defined]
            self.state.check(type_of(msg), event_id)
            await self.handlers.routes[type(msg)](msg)
        except Exception as exc:  # noqa: BLE001 - every outcome is an event; a bug is logged below
            error = self.protocol.error_of(exc, event_id)
            if error is None:  # a bug: reported to this client, the connection and the server go on
                logger.exception("%s: unexpected error handling a message", self.protocol.name)
                error = internal_error(exc, event_id)
            await self.peer.emit_error(error)

    def _named(self, event: dict[str, Any]) -> dict[str, Any]:
        old = self.old_names.get(event.get("type", "")) if self.old_names else None
        return event if old is None else {**event, "type": old}

    async def reject(self, error: ProtocolError) -> None:
        """Answer a frame the endpoint refused unread (e.g. too large)."""
        if self.state.phase is not GONE:
            await self.peer.emit_error(error)

    def disconnected(self) -> None:
        """The socket is gone: later frames are ignored (call ``close`` after the last ``handle``)."""
        self.state.gone()

    async def close(self) -> None:
        """After the last ``handle``: GONE, then the handlers release what the connection holds."""
        self.state.gone()
        await self.handlers.close()
