"""The manifest: control state of one transfer of KV units (docs/contracts.md 3, 5).

A transfer moves whole consistency units: for each block, its KV bytes in every layer (bulk
channel) and, in the manifest (control channel), its key, byte count, checksum and route record.
The manifest also carries what the receiver needs to read the bulk bytes (the source's NIXL agent
name, metadata and per-block region addresses) and the identity it must check (source instance,
transfer id, cache epoch, provenance digest, KV layout, R3 format).

All types are immutable ``msgspec`` Structs encoded as msgpack. :class:`Decoder` validates types
and bounds while decoding: a malformed or oversized message raises ``TransferError(PROTOCOL)``,
never a ``KeyError`` deep in the caller. Semantic checks (ids, keys, sizes against the receiver's
own layout) are in :mod:`execstate.transfer.checks`.

Region addresses (``Manifest.block_addrs[i]``) list, for block ``i``, the base address of its K
region then its V region in layer 0, then layer 1, ... (``2 * num_layers`` ints); every region
is ``KVLayout.region_nbytes`` long. Route records (``BlockEntry.routes``) are the raw
little-endian int16 bytes of ``[block_size, n_moe_layers, top_k]`` (C order).
"""

from __future__ import annotations

from typing import Annotated, Generic, Literal, TypeVar

import msgspec
import numpy as np
from msgspec import Meta, Struct

from execstate.identity.keys import KEY_BYTES
from execstate.transfer.errors import ErrorCode, TransferError

FORMAT_VERSION = 2
"""Version of every message and of the checksum/route/address conventions above."""

CHECKSUM_BYTES = 32
"""Checksum size (``identity/checksum.py``; see :func:`execstate.transfer.checks.block_checksum`)."""

MAX_BLOCKS = 1 << 16
"""Most blocks one manifest may list (1M tokens at block size 16)."""

MAX_LAYERS = 1024
MAX_MESSAGE_BYTES = 64 << 20
"""Largest control message accepted by either side (also the ZeroMQ ``MAXMSGSIZE``)."""

KVDType = Literal["float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2"]
ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

_Dim = Annotated[int, Meta(ge=1, le=1 << 20)]
_Count = Annotated[int, Meta(ge=0, le=1 << 40)]
_Addr = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]  # user-space addresses
_Name = Annotated[str, Meta(min_length=1, max_length=256)]
_Key = Annotated[bytes, Meta(min_length=KEY_BYTES, max_length=KEY_BYTES)]
_Checksum = Annotated[bytes, Meta(min_length=CHECKSUM_BYTES, max_length=CHECKSUM_BYTES)]


class KVLayout(Struct, frozen=True, forbid_unknown_fields=True):
    """Shape of one KV block: ``num_layers`` x (K, V) x ``[block_size, num_kv_heads, head_dim]``."""

    num_layers: Annotated[int, Meta(ge=1, le=MAX_LAYERS)]
    block_size: _Dim
    num_kv_heads: _Dim
    head_dim: _Dim
    dtype: KVDType

    @property
    def region_nbytes(self) -> int:
        """Bytes of one block's K (or V) region in one layer."""
        return self.block_size * self.num_kv_heads * self.head_dim * ITEMSIZE[self.dtype]

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block's K and V in every layer."""
        return 2 * self.num_layers * self.region_nbytes


class R3Format(Struct, frozen=True, forbid_unknown_fields=True):
    """Route record format: ``int16[block_size, n_moe_layers, top_k]`` per block (docs/contracts.md 3, 4)."""

    n_moe_layers: _Dim
    top_k: _Dim
    dtype: Literal["int16"] = "int16"

    def record_nbytes(self, block_size: int) -> int:
        return block_size * self.n_moe_layers * self.top_k * 2


class Capabilities(Struct, frozen=True, forbid_unknown_fields=True):
    """What one instance is: exchanged in the handshake, compared by ``check_compatible``.

    ``provenance_digest`` is ``Provenance.digest()`` (binds model, weights version, dtype,
    numerics, route mode, cache salt). ``r3`` is ``None`` for a model without MoE route capture.
    """

    format_version: int
    instance_id: _Name
    provenance_digest: _Name
    kv_layout: KVLayout
    r3: R3Format | None
    bulk: _Name = "nixl-ucx"


class BlockEntry(Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One unit of the transfer: position ``index`` in the sequence, its key, KV byte count,
    sha256 of its KV bytes and its route record (``None`` when the transfer carries no routes)."""

    index: _Count
    key: _Key
    nbytes: _Count
    checksum: _Checksum
    routes: bytes | None


class Manifest(Struct, frozen=True, forbid_unknown_fields=True, tag=True):
    """Immutable snapshot of one export (see the module docstring for addresses and routes).

    ``num_tokens`` is the count of valid tokens the blocks hold: blocks ``0..n-2`` are full,
    the last one holds ``num_tokens - (n - 1) * block_size`` valid tokens (rows beyond are padding).
    ``epoch`` is the source cache epoch at export; ``r3`` is ``None`` iff no block has routes.
    """

    format_version: int
    source_instance_id: _Name
    transfer_id: _Name
    epoch: _Count
    provenance_digest: _Name
    kv_layout: KVLayout
    r3: R3Format | None
    num_tokens: _Count
    blocks: Annotated[list[BlockEntry], Meta(max_length=MAX_BLOCKS)]
    agent_name: _Name
    agent_metadata: bytes
    block_addrs: Annotated[list[list[_Addr]], Meta(max_length=MAX_BLOCKS)]


def pack_routes(
    routes: np.ndarray, r3: R3Format, block_size: int, num_blocks: int, num_tokens: int
) -> list[bytes]:
    """Route records of ``num_blocks`` blocks from ``int16 [R, n_moe_layers, top_k]`` rows.

    ``num_tokens <= R <= num_blocks * block_size``; rows past ``R`` are zero padding (never valid:
    receivers slice to ``num_tokens``). ``ValueError`` for another dtype or shape.
    """
    shape = (r3.n_moe_layers, r3.top_k)
    if routes.dtype != np.int16 or routes.ndim != 3 or routes.shape[1:] != shape:
        raise ValueError(
            f"routes must be int16 [R, {shape[0]}, {shape[1]}], got {routes.dtype} {routes.shape}"
        )
    if not num_tokens <= routes.shape[0] <= num_blocks * block_size:
        raise ValueError(f"routes have {routes.shape[0]} rows; need {num_tokens}..{num_blocks * block_size}")
    padded = np.zeros((num_blocks * block_size, *shape), dtype="<i2")
    padded[: routes.shape[0]] = routes
    return [padded[i * block_size : (i + 1) * block_size].tobytes() for i in range(num_blocks)]


def unpack_routes(records: list[bytes], r3: R3Format, block_size: int) -> np.ndarray:
    """``int16 [len(records) * block_size, n_moe_layers, top_k]`` from route records (a copy)."""
    rows = np.frombuffer(b"".join(records), dtype="<i2")
    return rows.reshape(len(records) * block_size, r3.n_moe_layers, r3.top_k).astype(np.int16)


T = TypeVar("T")


def encode(obj: Struct) -> bytes:
    """msgpack bytes of a message (thread-safe)."""
    return msgspec.msgpack.encode(obj)


class Decoder(Generic[T]):
    """Typed msgpack decoder; one instance per thread (not shared across threads).

    ``decode`` raises ``TransferError(PROTOCOL)`` for oversized input, bad msgpack or a value
    that does not match the schema (wrong type, unknown field or tag, violated bound).
    """

    def __init__(self, type_: type[T] | object, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._decoder = msgspec.msgpack.Decoder(type_)
        self._max_bytes = max_bytes

    def decode(self, data: bytes | memoryview) -> T:
        if len(data) > self._max_bytes:
            raise TransferError(ErrorCode.PROTOCOL, f"message of {len(data)} bytes > {self._max_bytes}")
        try:
            return self._decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise TransferError(ErrorCode.PROTOCOL, f"malformed message: {e}") from None
