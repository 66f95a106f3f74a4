"""What every kind's migration offer shares on the wire: the event queue as it travels and the
signed envelope (typed ``msgspec`` messages encoded as msgpack, never pickle).

- **Events** (:class:`WireEvents`): the pending events as their clients submitted them (a
  composite as ``{"events": [{"kind", "data"}, ...]}``), the id watermark and the remembered
  acknowledgements. :func:`events_to_wire` writes a queue's snapshot with the kind's
  ``payload(event)`` (an applied payload back to its submitted form); :func:`queue_from_wire`
  submits the pending events again through the *receiving* side's event kinds, so they are
  validated by the model that will apply them, then restores the watermark and acknowledgements.
- **Envelope** (:class:`SignedEnvelope`): the offer's msgpack bytes and
  ``HMAC-SHA256(secret, domain + payload)`` in hex (None when unsigned). Each kind has its own
  domain, so an offer of one kind never verifies as the other's. :func:`open_envelope` checks the
  size, the envelope's shape and the signature; whether an unsigned offer is acceptable is the
  kind's decision (``require_signature``). Secrets are a ``SecretRing`` (``identity/secret_ring.py``):
  the current secret signs, the current and the previous ones verify (a rotation), or plain
  bytes (one secret).

Every refusal is a :class:`MigrationError` (``invalid`` or ``unauthorized``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from execstate.identity.secret_ring import SecretRing
from execstate.session.runtime.events import (
    COMPOSITE,
    Event,
    EventAck,
    EventId,
    EventKind,
    EventQueue,
    QueueSnapshot,
    SessionEventError,
)
from execstate.session.runtime.migration import MigrationError

MAX_EVENTS = 4096

_Count = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
_Name = Annotated[str, Meta(min_length=1, max_length=256)]


class WirePending(Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One pending event as its client submitted it (a composite as ``{"events": [...]}``); the
    target validates it again with its own event kinds."""

    event_id: _Count
    kind: _Name
    data: Any


class WireAck(Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    event_id: _Count
    kind: _Name
    status: _Name


class WireEvents(Struct, frozen=True, forbid_unknown_fields=True):
    pending: Annotated[list[WirePending], Meta(max_length=MAX_EVENTS)]
    last_event_id: _Count | None
    acks: Annotated[list[WireAck], Meta(max_length=MAX_EVENTS)]


class SignedEnvelope(Struct, frozen=True, forbid_unknown_fields=True):
    """An offer's msgpack bytes and their HMAC (hex), None when unsigned."""

    payload: bytes
    signature: Annotated[str, Meta(min_length=64, max_length=64)] | None


# -- events ------------------------------------------------------------------------------------------
def events_to_wire(snap: QueueSnapshot, payload: Callable[[Event], Any]) -> WireEvents:
    """A queue snapshot as it travels; ``payload(e)``: an event's validated data as submitted."""
    pending = []
    for entry in snap.pending:
        first = entry[0]
        if len(entry) == 1 and first.part is None:
            pending.append(WirePending(int(first.event_id), first.kind, payload(first)))
        else:
            parts = [{"kind": e.kind, "data": payload(e)} for e in entry]
            pending.append(WirePending(int(first.event_id), COMPOSITE, {"events": parts}))
    acks = [WireAck(int(eid), ack.kind, ack.status) for eid, ack in snap.acks]
    return WireEvents(pending, None if snap.last_id is None else int(snap.last_id), acks)


def queue_from_wire(ev: WireEvents, kinds: Mapping[str, EventKind], max_pending: int,
                    bad: Callable[[str, str], MigrationError]) -> EventQueue:
    """A queue of ``max_pending`` holding ``ev``'s pending events (validated by ``kinds``), its
    watermark and acknowledgements. ``bad(field, why)`` builds the refusal (``events.pending``:
    a refused event, or more events than ``max_pending``)."""
    probe = EventQueue(kinds, max(max_pending, len(ev.pending), 1))
    try:
        for p in ev.pending:
            probe.submit(p.event_id, p.kind, p.data)
    except SessionEventError as e:
        raise bad("events.pending", e.message) from None
    if len(ev.pending) > max_pending:
        raise bad("events.pending", f"{len(ev.pending)} events (this side queues {max_pending})")
    acks = tuple((EventId(a.event_id), EventAck(EventId(a.event_id), a.kind, a.status)) for a in ev.acks)
    queue = EventQueue(kinds, max_pending)
    queue.restore(QueueSnapshot(probe.snapshot().pending,
                                None if ev.last_event_id is None else EventId(ev.last_event_id), acks))
    return queue


# -- envelope -------------------------------------------------------------------------------------
def seal(payload: bytes, secret: SecretRing | None, domain: bytes) -> bytes:
    """The envelope's bytes (signed with the current secret when one is given)."""
    sig = None if secret is None else secret.sign(domain, payload)
    return msgspec.msgpack.encode(SignedEnvelope(payload, sig))


def open_envelope(data: bytes, secret: SecretRing | None, domain: bytes, *, what: str, max_bytes: int,
                  require_signature: bool, no_secret: str) -> tuple[bytes, bool]:
    """The payload in ``data`` and whether its signature verified. ``invalid``: not bytes, over
    ``max_bytes``, a malformed envelope; ``unauthorized``: a signature that does not verify, a
    signed envelope without a ``secret`` to check it (``no_secret`` says where one comes from), or
    an unsigned one when ``require_signature``."""
    if not isinstance(data, bytes | bytearray) or len(data) > max_bytes:
        size = f"{len(data)} bytes" if isinstance(data, bytes | bytearray) else type(data).__name__
        raise MigrationError("invalid", f"a {what} is bytes of at most {max_bytes}, got {size}")
    try:
        env = msgspec.msgpack.decode(data, type=SignedEnvelope)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MigrationError("invalid", f"malformed {what} envelope: {e}") from None
    if env.signature is None:
        if require_signature:
            raise MigrationError("unauthorized", f"an unsigned {what} (this side requires a signature)")
        return env.payload, False
    if secret is None:
        raise MigrationError("unauthorized", f"the {what} is signed but {no_secret}")
    if not secret.verify(domain, env.payload, env.signature):
        raise MigrationError("unauthorized", f"the {what}'s signature does not match (tampered, or another secret)")
    return env.payload, True
