"""One offload unit: its record and its byte format (docs/offload.md "The unit").

A unit is one full KV block as a consistency unit (docs/contracts.md 3): the KV bytes of
every layer, the route rows (``int16[block_size, n_moe_layers, top_k]``, little-endian, C order;
absent for a dense model or without route return) and a :class:`UnitRecord`:

- ``key``: the block's execution-state key, ``block_key(parent, token_ids)``; a tier stores the
  unit under it and nothing else (content-addressed);
- ``parent``: the previous block's key, or ``root`` for the first block;
- ``root``: the provenance root (model, weights version, dtype, numerics, route mode, tenant
  salt): a unit of another identity names another root;
- ``token_ids``: the block's tokens;
- ``layout``: the KV and route shapes the bytes have;
- ``kv_checksum``: the checksum (``identity/checksum.py``, BLAKE3-256) of the KV bytes, K then
  V of layer 0, K then V of layer 1, ... (``KVPool.export_block``; the order of
  ``transfer.checks.block_checksums``); ``routes_checksum``: the checksum of the route bytes;
- ``tag``: the writer's signature, ``SecretRing.sign(DOMAIN, record encoded with tag=None)``.
  Every unit is signed: by the instances' shared ring on a shared tier, by a per-process key
  (``SecretRing.ephemeral``) on a local one, so a unit proves who wrote it and a checksum
  recomputed by anyone else is refused;
- ``weights_version``: the provenance's weights version, spelled out (the root already binds
  it; the KV events a tier publishes name it: ``state/kv_events/recorder.py``); ``None`` when the writer
  did not know it. Signed with the rest;
- ``tenant``: the tenant whose request computed it (the root already binds the scope; a tier's
  KV events leave out the units of tenants the operator excluded); ``None`` when unknown.

Blob (what disk files and Redis values hold)::

    MAGIC (8 bytes) | u32 little-endian len(record) | record (msgpack) | route bytes | KV bytes

:func:`unpack_unit` checks the framing (magic, lengths against the record's own layout) and
raises :class:`UnitFormatError` naming what is wrong; what the record must match (the keys the
reader computed itself, its layout) is checked in ``transfer/unit_checks.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from execstate.identity.secret_ring import SecretRing

FORMAT_VERSION = 2
MAGIC = b"ESUNIT1\x00"
DOMAIN = b"execstate/v1/offload-unit\x00"
MAX_RECORD_BYTES = 1 << 20

_Key = Annotated[bytes, Meta(min_length=32, max_length=32)]
_Dim = Annotated[int, Meta(ge=1, le=1 << 20)]
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}


class UnitFormatError(ValueError):
    """A blob that is not a well-formed unit (bad magic, truncated, malformed record)."""


class UnitLayout(Struct, frozen=True, forbid_unknown_fields=True):
    """Shapes of a unit's bytes: KV ``num_layers x (K, V) x [block_size, num_kv_heads, head_dim]``
    of ``dtype``; route rows ``[block_size, route_layers, route_top_k]`` int16 when both are set."""

    num_layers: _Dim
    block_size: _Dim
    num_kv_heads: _Dim
    head_dim: _Dim
    dtype: str
    route_layers: _Dim | None = None
    route_top_k: _Dim | None = None

    @property
    def kv_nbytes(self) -> int:
        if self.dtype not in _ITEMSIZE:
            raise UnitFormatError(f"unknown KV dtype {self.dtype!r}")
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * _ITEMSIZE[self.dtype]

    @property
    def routes_nbytes(self) -> int:
        if self.route_layers is None or self.route_top_k is None:
            return 0
        return self.block_size * self.route_layers * self.route_top_k * 2


class UnitRecord(Struct, frozen=True, forbid_unknown_fields=True):
    """The control state of one unit (module docstring)."""

    format_version: int
    key: _Key
    parent: _Key
    root: _Key
    token_ids: list[int]
    layout: UnitLayout
    kv_checksum: _Key
    routes_checksum: _Key | None
    tag: str | None = None
    weights_version: str | None = None
    tenant: str | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(UnitRecord)


def _body(record: UnitRecord) -> bytes:
    return _ENCODER.encode(msgspec.structs.replace(record, tag=None))


def sign(record: UnitRecord, ring: SecretRing) -> UnitRecord:
    """``record`` with its tag under ``ring``'s current secret."""
    return msgspec.structs.replace(record, tag=ring.sign(DOMAIN, _body(record)))


def tag_valid(record: UnitRecord, ring: SecretRing) -> bool:
    """True when the record's tag verifies under any secret ``ring`` accepts (an unsigned record never does)."""
    return record.tag is not None and ring.verify(DOMAIN, _body(record), record.tag)


def encode_record(record: UnitRecord) -> bytes:
    return _ENCODER.encode(record)


def pack_unit(
    record: UnitRecord, routes: bytes | memoryview | None, kv: bytes | memoryview
) -> list[bytes | memoryview]:
    """The blob's parts in order (write them one after the other; no concatenated copy)."""
    head = encode_record(record)
    parts: list[bytes | memoryview] = [MAGIC + len(head).to_bytes(4, "little") + head]
    if routes is not None and len(routes):
        parts.append(routes)
    parts.append(kv)
    return parts


def blob_nbytes(parts: Sequence[bytes | memoryview]) -> int:
    return sum(memoryview(p).nbytes for p in parts)


def read_record(head: bytes | bytearray | memoryview) -> UnitRecord | None:
    """The record at the start of a blob (``head``: its first part, or at least its first
    ``12 + len(record)`` bytes), or None when it is not one; the rest of the blob is not looked
    at (a tier names the unit in its KV events with it; the reader still checks everything)."""
    view = memoryview(head).cast("B")
    start = len(MAGIC) + 4
    if len(view) < start or bytes(view[: len(MAGIC)]) != MAGIC:
        return None
    n = int.from_bytes(view[len(MAGIC) : start], "little")
    if n > MAX_RECORD_BYTES or start + n > len(view):
        return None
    try:
        return _DECODER.decode(view[start : start + n])
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def unpack_unit(blob: bytes | bytearray | memoryview) -> tuple[UnitRecord, memoryview | None, memoryview]:
    """``(record, route bytes or None, KV bytes)`` as views of ``blob``; :class:`UnitFormatError`
    for a blob that is not exactly one unit of the layout its record names."""
    view = memoryview(blob).cast("B")
    if len(view) < len(MAGIC) + 4 or bytes(view[: len(MAGIC)]) != MAGIC:
        raise UnitFormatError("not a unit (bad magic or shorter than its header)")
    n = int.from_bytes(view[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    if n > MAX_RECORD_BYTES or start + n > len(view):
        raise UnitFormatError(f"truncated: record of {n} bytes, blob of {len(view)}")
    try:
        record = _DECODER.decode(view[start : start + n])
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise UnitFormatError(f"malformed record: {e}") from None
    r_n, kv_n = record.layout.routes_nbytes, record.layout.kv_nbytes
    body = start + n
    if len(view) != body + r_n + kv_n:
        raise UnitFormatError(f"truncated: {len(view) - body} bytes after the record, its layout needs {r_n + kv_n}")
    routes = view[body : body + r_n] if r_n else None
    return record, routes, view[body + r_n :]
