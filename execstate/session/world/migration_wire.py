"""A migrating world session as it travels: one signed msgpack message (``msgspec``, never pickle).

Unlike an LM session (whose KV goes through the PD connectors of an ``LLMEngine``,
``session/lm/migration_wire.py``), a world session's K/V is small (its rolling window: a few chunks
of a few hundred KB) and lives in the ``World``'s own pool, so it travels inside the message:

- **Contents** (:class:`WorldOffer`): session id, provenance digest (model, weights version,
  dtype, numerics: the target must compute exactly the same), frame shape, frames per chunk,
  the K/V layout and the window (sink, window chunks), the chunks of the block table (each its
  K then V as float32 little-endian ``[n_layers, tokens_per_chunk, heads, head_dim]``, C order,
  with its sha256), the number of chunks committed, the history key, the carry (float32 bytes
  and shape), the noise generator's state, the prompt text and version, the held key, step
  index, event epoch (and the highest epoch), branch id, seed, and the event queue (pending
  events as their clients submitted them, the id watermark, acknowledgements: the LM wire's
  :class:`WireEvents`). Checkpoints stay behind (the target's origin is the arrival state).
- **Signature**: ``HMAC-SHA256(secret, DOMAIN + payload)`` when the sides share a secret; a
  signed message needs the secret to be read, and a target given a secret refuses unsigned ones.
  The envelope and the event queue's wire form are the kind-agnostic ones
  (``session/runtime/migration_wire.py``).
- **Decoding** checks types and bounds (``MigrationError("invalid")``); the checks against the
  receiving model are in ``session/world/migration.py``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from execstate.identity.secret_ring import SecretRing
from execstate.session.runtime.migration import MigrationError
from execstate.session.runtime.migration_wire import SignedEnvelope, WireEvents, open_envelope, seal
from execstate.session.world.camera import CameraMotion, CameraState, command_to_data, parse_command

FORMAT_VERSION = 1
DOMAIN = b"execstate/v1/world-session-offer\x00"
MAX_OFFER_BYTES = 256 << 20
MAX_CHUNKS = 64

_Count = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
_Name = Annotated[str, Meta(min_length=1, max_length=256)]
_SessionId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
_Dim = Annotated[int, Meta(ge=1, le=1 << 20)]


class WireChunk(Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    k: bytes
    v: bytes
    sha256: Annotated[str, Meta(min_length=64, max_length=64)]


class WireHeld(Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    key: _Name
    event_id: _Count


class WireCamera(Struct, frozen=True, forbid_unknown_fields=True):
    """The camera state (``session/world/camera.py``): the last frame's pose and the motion in
    progress (its event id, its command as a client submits it, and a target's turn and progress)."""

    yaw: float
    pitch: float
    event_id: _Count | None = None
    command: dict[str, float | int | str | bool] | None = None
    turn_yaw: float = 0.0
    turn_pitch: float = 0.0
    total: _Count = 0
    done: _Count = 0


def camera_to_wire(c: CameraState) -> WireCamera:
    m = c.motion
    if m is None:
        return WireCamera(c.yaw, c.pitch)
    return WireCamera(c.yaw, c.pitch, m.event_id, command_to_data(m.command), m.turn_yaw, m.turn_pitch, m.total,
                      m.done)


def camera_from_wire(w: WireCamera, frames_per_chunk: int) -> CameraState:
    """The state back, checked (``ValueError``: non-finite values, a bad command, progress past the end)."""
    values = (w.yaw, w.pitch, w.turn_yaw, w.turn_pitch)
    if not all(math.isfinite(v) for v in values):
        raise ValueError("camera values must be finite")
    if (w.event_id is None) != (w.command is None):
        raise ValueError("a camera motion needs both its event id and its command")
    if w.event_id is None or w.command is None:
        return CameraState(w.yaw, w.pitch)
    if w.done > w.total:
        raise ValueError("a camera target's progress is past its end")
    cmd = parse_command(w.command, frames_per_chunk)
    return CameraState(w.yaw, w.pitch, CameraMotion(w.event_id, cmd, w.turn_yaw, w.turn_pitch, w.total, w.done))


class WorldOffer(Struct, frozen=True, forbid_unknown_fields=True):
    format_version: int
    session_id: _SessionId
    provenance_digest: _Name
    frame_shape: Annotated[list[_Dim], Meta(min_length=3, max_length=3)]
    frames_per_chunk: _Dim
    kv_layout: Annotated[list[_Dim], Meta(min_length=4, max_length=4)]  # layers, heads, head_dim, tokens/chunk
    sink_chunks: _Count
    window_chunks: _Dim
    chunks: Annotated[list[WireChunk], Meta(max_length=MAX_CHUNKS)]
    n_chunks: _Count
    history: Annotated[bytes, Meta(min_length=32, max_length=32)]
    carry: bytes
    carry_shape: Annotated[list[_Dim], Meta(max_length=8)]
    rng_state: Annotated[bytes, Meta(max_length=1 << 16)]
    prompt: Annotated[str, Meta(max_length=4096)]
    prompt_version: _Count
    held: WireHeld | None
    step_index: _Count
    event_epoch: _Count
    max_event_epoch: _Count
    branch_id: _Name
    seed: _Count
    events: WireEvents
    camera: WireCamera | None = None  # a model with a camera rig


SignedWorldOffer = SignedEnvelope


def chunk_digest(k: bytes, v: bytes) -> str:
    return hashlib.sha256(k + v).hexdigest()


def encode_world_offer(offer: WorldOffer, secret: SecretRing | None) -> bytes:
    return seal(msgspec.msgpack.encode(offer), secret, DOMAIN)


def decode_world_offer(data: bytes, secret: SecretRing | None) -> WorldOffer:
    """The offer in ``data``; ``MigrationError`` ``invalid``, ``unauthorized`` or ``incompatible``."""
    payload, _ = open_envelope(data, secret, DOMAIN, what="world session offer", max_bytes=MAX_OFFER_BYTES,
                               require_signature=secret is not None, no_secret="no secret was given")
    try:
        offer = msgspec.msgpack.decode(payload, type=WorldOffer)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise MigrationError("invalid", f"malformed world session offer: {e}") from None
    if offer.format_version != FORMAT_VERSION:
        raise MigrationError("incompatible", f"world session offer format {offer.format_version}, this side reads "
                             f"{FORMAT_VERSION}")
    return offer
